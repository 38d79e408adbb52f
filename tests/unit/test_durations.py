"""One duration parser (agentrun_cli/durations.py) for every flag and agent-file field that
takes a length of time: the same forms everywhere, a bad value named with its flag or field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentrun_cli import agent_files, durations
from agentrun_cli.admin_commands import _key_request
from agentrun_cli.parser import parse


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("1.5", 1.5),
        ("90s", 90),
        ("15m", 900),
        ("12h", 43_200),
        ("30d", 2_592_000),
        ("2w", 1_209_600),
        ("1d2h", 93_600),
        ("1h30m", 5_400),
        ("1.5h", 5_400),
        ("1 hour 30 minutes", 5_400),
        ("1:30", 90),
        ("PT1H", 3_600),
        ("P1DT2H", 93_600),
        ("pt0.5s", 0.5),
        ("0", 0),
    ],
)
def test_every_form_reads_as_seconds(text: str, seconds: float) -> None:
    assert durations.parse(text) == seconds


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "'' is not a duration (e.g. 90, 90s"),
        ("soon", "'soon' is not a duration"),
        ("5x", "'5x' is not a duration"),
        ("nan", "'nan' is not a duration"),
        ("inf", "'inf' is not a duration"),
        ("-5", "'-5' must be between 0 and 315576000000 seconds"),
        ("-5m", "'-5m' must be between 0"),
        ("99999999999999", "must be between 0"),
        ("P1M", "'P1M': months and years have no fixed length"),
        ("PT", "'PT' is not a duration"),
    ],
)
def test_what_is_not_a_duration_is_refused_naming_it(text: str, words: str) -> None:
    with pytest.raises(durations.DurationError) as refused:
        durations.parse(text)
    assert words in str(refused.value)


def test_flags_take_every_form_and_a_bad_one_is_a_usage_error_naming_the_flag(capsys) -> None:
    assert parse(["releases", "drain", "r1", "--finish-within", "1h30m"]).finish_within == 5400
    assert parse(["canary", "--timeout", "PT2M"]).timeout == 120
    assert parse(["canary", "--timeout", "45"]).timeout == 45  # plain seconds, as before
    assert parse(["triggers", "create", "t", "--agent", "a", "--every", "1d2h"]).every == 93_600
    assert parse(["runs", "list", "--since", "1.5h"]).since == "1.5h"
    for argv, flag in [
        (["releases", "drain", "r1", "--finish-within", "soon"], "--finish-within"),
        (["runs", "list", "--since", "0s"], "--since"),
        (
            ["apikeys", "create", "--name", "ci", "--role", "reader", "--expires-in", "0"],
            "--expires-in",
        ),
    ]:
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and f"argument {flag}: '{argv[-1]}'" in err, err


def test_an_api_key_expires_after_the_duration_given() -> None:
    args = parse(["apikeys", "create", "--name", "ci", "--role", "reader", "--expires-in", "1d12h"])
    expires = _key_request(args).expire_time.ToDatetime(tzinfo=UTC)
    assert abs(expires - (datetime.now(UTC) + timedelta(hours=36))) < timedelta(minutes=1)


def test_an_agent_file_reads_durations_the_same_way_and_names_a_bad_field() -> None:
    doc = {
        "agent": "bot",
        "model": "demo",
        "limits": {"deadline": "1h30m", "max_age": "P7D", "max_steps": 5},
        "approval": {"tools": ["send_email"], "expiry": "1.5h"},
    }
    spec = agent_files.parse(doc).spec
    assert spec.limits.deadline.seconds == 5400
    assert spec.limits.max_age.ToTimedelta() == timedelta(days=7)
    assert spec.approval.expiry_seconds == 5400
    doc["limits"] = {"deadline": 600}
    assert agent_files.parse(doc).spec.limits.deadline.seconds == 600
    doc["limits"] = {"deadline": "0.5s"}
    assert agent_files.parse(doc).spec.limits.deadline.nanos == 500_000_000
    for limits, words in [
        ({"deadline": "ten minutes"}, "limits.deadline: 'ten minutes' is not a duration"),
        ({"max_age": True}, "limits.max_age: True is not a duration"),
        ({"deadline": "-1h"}, "limits.deadline: '-1h' must be between 0"),
    ]:
        with pytest.raises(agent_files.AgentFileError) as refused:
            agent_files.parse({**doc, "limits": limits})
        assert words in str(refused.value)
