"""The wait_for_event call's arguments (executor/event_wait.py): the keys its park carries,
and what makes the call an error the model reads instead of a park."""

from __future__ import annotations

import json

import pytest

from executor import event_wait


def test_one_event_binds_its_key_from_the_run_input_and_the_park_carries_it():
    wait = event_wait.wait_of(
        {"name": "invoice.paid", "match": "event.customer == run.input.customer"},
        {"customer": "c1"},
    )
    assert wait.mode == "any" and wait.lookback == 0
    assert wait.slots == [{"name": "invoice.paid", "key": [["customer", "c1"]]}]
    step, park = event_wait.park(5, 4, wait, 30.0)
    payload = json.loads(step.payload_json)
    assert payload["wait_reason"] == "event" and payload["wake_after_seconds"] == 30.0
    assert payload["event_wait"] == {
        "call_seq": 4,
        "slots": wait.slots,
        "mode": "any",
        "lookback_seconds": 0.0,
    }
    assert park.wait_reason == "event"


def test_several_events_all_of_them_with_a_look_back():
    wait = event_wait.wait_of(
        {
            "events": [{"name": "a"}, {"name": "b", "match": "event.n == 2"}],
            "mode": "all",
            "lookback": 60,
        },
        None,
    )
    assert wait.mode == "all" and wait.lookback == 60
    assert [s["key"] for s in wait.slots] == [[], [["n", 2]]]


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"name": "a", "match": "event.x > 1"}, "match: cannot read"),
        ({"name": "a", "match": "event.x == run.input.x"}, "run.input.x is not in the run's input"),
        ({"name": "bad name"}, "name must be an event name"),
        ({"events": []}, "events must be a list"),
        ({"events": [{"name": "a"}], "mode": "some"}, "mode must be"),
        ({"name": "a", "lookback": -1}, "lookback must be"),
        ({"events": [{"name": "a", "match": 3}]}, "events[0]match must be a string"),
    ],
)
def test_bad_arguments_are_an_error_saying_what(arguments, says):
    with pytest.raises(ValueError) as bad:
        event_wait.wait_of(arguments, "plain text")
    assert says in str(bad.value)
