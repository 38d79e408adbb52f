"""Match expressions (ground/event_match.py): what parses, what a wait's key is, and how an
event's body projects onto it."""

from __future__ import annotations

import pytest

from ground import event_match as em


def test_a_comparison_binds_the_run_side_and_the_body_projects_onto_the_same_key():
    match = em.parse("event.customer == run.input.customer and 'paid' == event.status")
    key = em.bind(match, {"customer": "c1"})
    assert key == [["customer", "c1"], ["status", "paid"]]
    assert em.project({"status": "paid", "customer": "c1", "x": 1}, em.shape(key)) == key
    assert em.project({"customer": "c1"}, em.shape(key)) is None
    assert em.containment([["a.b", 1], ["c", True]]) == {"a": {"b": 1}, "c": True}


def test_nested_paths_literals_and_the_empty_expression():
    key = em.bind(
        em.parse("event.order.id == run.input.order.id && event.n == 3"), {"order": {"id": 7}}
    )
    assert key == [["n", 3], ["order.id", 7]]
    assert em.bind(em.parse("  "), None) == []
    assert em.bind(em.parse("event.ok == true and event.gone == null"), None) == [
        ["gone", None],
        ["ok", True],
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("event.customer > 3", "cannot read"),
        ("event.a == event.b", "exactly one event"),
        ("run.input.a == 3", "exactly one event"),
        ("event.a == run.id", "unknown run field"),
        ("event.a == 1 or event.b == 2", "expected `and`"),
        ("event.a", "expected comparisons"),
        ("event == 1", "needs a field"),
        ("__import__('os') == 1", "cannot read"),
        ("size == 1", "unexpected 'size'"),
    ],
)
def test_anything_else_is_refused_saying_what(text, says):
    with pytest.raises(em.ExpressionError, match=says):
        em.parse(text)


def test_a_run_side_the_input_lacks_or_two_values_for_one_path_are_refused():
    with pytest.raises(em.ExpressionError, match="run.input.customer is not in the run's input"):
        em.bind(em.parse("event.customer == run.input.customer"), "plain text")
    with pytest.raises(em.ExpressionError, match="two values"):
        em.bind(em.parse("event.a == 1 and event.a == 2"), {})


def test_json_equality_is_the_databases():
    assert em.same(1, 1.0) and not em.same(True, 1) and em.same(None, None)
