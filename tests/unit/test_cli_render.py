"""The CLI's rendering of runs and steps (hand-built messages) and its argument parsing."""

from __future__ import annotations

import json

import pytest
from google.protobuf import timestamp_pb2

from agentrun.v1 import agent_pb2, run_pb2
from agentrun_cli import launch, render, stack
from agentrun_cli.parser import parse as parse_argv


def step(seq: int, kind: int, payload: object, epoch: int = 1, ref_seq: int = 0) -> run_pb2.Step:
    return run_pb2.Step(
        run_id="r1",
        seq=seq,
        kind=kind,
        epoch=epoch,
        ref_seq=ref_seq,
        payload_json=payload if isinstance(payload, str) else json.dumps(payload),
    )


def ts(iso_seconds: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=iso_seconds)


# --- steps -----------------------------------------------------------------


def test_input_step_line() -> None:
    line = render.step_line(step(0, run_pb2.STEP_KIND_INPUT, {"text": "Follow up"}, epoch=0))
    assert line == '0 input "Follow up"'


def test_tool_started_line_names_tool_arguments_and_key() -> None:
    s = step(
        2,
        run_pb2.STEP_KIND_TOOL_STARTED,
        {
            "call_id": "c1",
            "tool": "send_email",
            "arguments": {"to": "ada@example.com"},
            "idempotency_key": "r1:2",
            "class": "provider_key",
        },
        ref_seq=1,
    )
    assert render.step_line(s) == (
        '2 tool_started send_email {"to": "ada@example.com"} key=r1:2 class=provider_key'
    )


def test_decision_line_shows_calls_text_and_tokens() -> None:
    s = step(
        1,
        run_pb2.STEP_KIND_MODEL_DECISION,
        {
            "content": "Looking her up.",
            "tool_calls": [
                {"id": "c1", "name": "crm_lookup", "arguments": {"email": "a@b.c"}},
                {"id": "c2", "name": "echo", "arguments_raw": "{not json"},
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30},
        },
    )
    assert render.step_line(s) == (
        '1 model_decision says "Looking her up."; calls crm_lookup({"email": "a@b.c"}), '
        'echo("{not json") [120+30 tokens]'
    )


@pytest.mark.parametrize(
    ("payload", "summary"),
    [
        (
            {"tool": "crm_lookup", "status": "ok", "output": {"stage": "trial"}},
            'crm_lookup ok {"stage": "trial"}',
        ),
        ({"tool": "echo", "status": "error", "error": "unknown tool"}, "echo error: unknown tool"),
        (
            {"tool": "send_email", "status": "unknown", "output": None, "resolution": "class none"},
            "send_email unknown null (resolved: class none)",
        ),
    ],
)
def test_tool_result_summaries(payload: dict[str, object], summary: str) -> None:
    assert render.step_summary(step(3, run_pb2.STEP_KIND_TOOL_RESULT, payload)) == summary


def test_park_and_finish_summaries() -> None:
    park = step(
        5,
        run_pb2.STEP_KIND_PARK,
        {"wait_reason": "sleep", "wake_after_seconds": 30, "note": "sleep tool"},
    )
    assert render.step_summary(park) == "sleep for 30s: sleep tool"
    done = step(9, run_pb2.STEP_KIND_FINISH, {"status": "completed", "output": "Sent."})
    assert render.step_summary(done) == 'completed "Sent."'
    failed = step(9, run_pb2.STEP_KIND_FINISH, {"status": "failed", "error": "max steps"})
    assert render.step_summary(failed) == "failed: max steps"


def test_unexpected_payloads_fall_back_to_raw_text() -> None:
    assert render.step_summary(step(1, run_pb2.STEP_KIND_INPUT, "not json")) == '"not json"'
    odd = step(1, run_pb2.STEP_KIND_MODEL_DECISION, {"tool_calls": "oops"})
    assert render.step_summary(odd).startswith('"{')
    assert render.step_line(step(4, 42, {"x": 1})).startswith("4 42 ")


def test_long_values_are_cut() -> None:
    s = step(0, run_pb2.STEP_KIND_INPUT, {"text": "x" * 500})
    assert len(render.step_summary(s)) == render.SHORT
    assert render.step_summary(s).endswith("…")


def test_step_table_has_seq_kind_epoch_and_summary() -> None:
    rows = render.step_table(
        [
            step(0, run_pb2.STEP_KIND_INPUT, {"text": "hi"}, epoch=0),
            step(12, run_pb2.STEP_KIND_FINISH, {"status": "completed", "output": "ok"}, epoch=3),
        ]
    )
    assert rows[0].split() == ["seq", "kind", "epoch", "summary"]
    assert rows[1].split() == ["0", "input", "e0", '"hi"']
    assert rows[2].split() == ["12", "finish", "e3", "completed", '"ok"']


# --- runs ------------------------------------------------------------------


def test_state_lines() -> None:
    waiting = run_pb2.Run(
        status=run_pb2.RUN_STATUS_WAITING, wait_reason="sleep", wake_time=ts(1_700_000_000)
    )
    assert render.state_line(waiting) == "status: waiting (sleep) until 2023-11-14T22:13:20Z"
    event = run_pb2.Run(status=run_pb2.RUN_STATUS_WAITING, wait_reason="approval")
    assert render.state_line(event) == "status: waiting (approval) on event"
    running = run_pb2.Run(
        status=run_pb2.RUN_STATUS_RUNNING, lease_owner="ex-1", lease_epoch=4, attempt=1
    )
    assert render.state_line(running) == "status: running on ex-1 epoch 4 attempt 1"
    failed = run_pb2.Run(status=run_pb2.RUN_STATUS_FAILED, error="deadline")
    assert render.state_line(failed) == "status: failed: deadline"


def test_run_summary_and_row() -> None:
    run = run_pb2.Run(
        run_id="r1",
        agent_id="demo",
        agent_version=2,
        status=run_pb2.RUN_STATUS_COMPLETED,
        input="hi",
        output="done",
        counters=run_pb2.RunCounters(steps=7, model_calls=2, tool_calls=3, tokens=900),
        create_time=ts(1_700_000_000),
    )
    summary = dict(line.split(None, 1) for line in render.run_summary(run))
    assert summary["state"] == "completed"
    assert summary["agent"] == "demo v2"
    assert summary["output"] == '"done"'
    assert summary["counters"] == "7 steps, 2 model calls, 3 tool calls, 900 tokens"
    assert summary["finished"] == "-"
    assert render.run_row(run).split() == [
        "r1",
        "demo@2",
        "completed",
        "2023-11-14T22:13:20Z",
        "7",
        "steps",
    ]


def test_run_summary_names_a_childs_call_entry_and_close_policy() -> None:
    child = run_pb2.Run(run_id="k", parent_run_id="p", parent_seq=4, parent_close="cancel")
    summary = dict(line.split(None, 1) for line in render.run_summary(child))
    assert summary["parent"] == "p (its start_child at step 4)"
    assert summary["close"] == "cancel, when its parent ends"
    child.parent_index = 0  # a start_children child: its place in the call's list
    summary = dict(line.split(None, 1) for line in render.run_summary(child))
    assert summary["parent"] == "p (its start_children, entry 0, at step 4)"


def test_event_lines_drop_repeated_states() -> None:
    queued = run_pb2.Run(status=run_pb2.RUN_STATUS_QUEUED)
    events = [
        run_pb2.WatchRunResponse(run=queued),
        run_pb2.WatchRunResponse(step=step(0, run_pb2.STEP_KIND_INPUT, {"text": "hi"})),
        run_pb2.WatchRunResponse(run=queued),  # resent after a reconnect
        run_pb2.WatchRunResponse(
            run=run_pb2.Run(status=run_pb2.RUN_STATUS_CANCELLED, error="user")
        ),
    ]
    assert list(render.event_lines(events)) == [
        "status: queued",
        '0 input "hi"',
        "status: cancelled: user",
    ]


def test_json_decodes_step_payloads_and_keeps_zero_fields() -> None:
    event = run_pb2.WatchRunResponse(step=step(0, run_pb2.STEP_KIND_INPUT, {"text": "hi"}))
    value = json.loads(render.to_json(event))
    assert value["step"]["payload"] == {"text": "hi"}
    assert value["step"]["seq"] == 0
    assert "payload_json" not in value["step"]
    both = json.loads(render.to_json({"agent": agent_pb2.Agent(agent_id="a"), "version": None}))
    assert both == {"agent": {**both["agent"], "agent_id": "a"}, "version": None}


def test_agent_lines_with_version() -> None:
    agent = agent_pb2.Agent(agent_id="demo", display_name="Demo", latest_version=1)
    spec = agent_pb2.AgentSpec(model="m", tools=["echo", "sleep"], instructions="Be brief.")
    spec.limits.deadline.FromSeconds(90)
    lines = render.agent_lines(agent, agent_pb2.AgentVersion(version=1, spec=spec))
    assert "tools     echo, sleep" in lines
    assert "limits    max_steps=default deadline=90s" in lines


def test_status_names_round_trip() -> None:
    for name in ["queued", "running", "waiting", "completed", "failed", "cancelled"]:
        assert render.status_name(render.status_value(name)) == name


# --- parsing ---------------------------------------------------------------


def parse(*argv: str):
    return parse_argv(list(argv))


def test_runs_start_requires_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("runs", "start", "demo")
    assert exit_.value.code == 2
    assert "--input" in capsys.readouterr().err


def test_runs_start_options() -> None:
    args = parse("runs", "start", "demo", "--input", "hi", "--version", "3", "--watch")
    assert (args.agent_id, args.input, args.version, args.request_id, args.watch) == (
        "demo",
        "hi",
        3,
        "",
        True,
    )


def test_global_options_before_or_after_the_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_ADDRESS", "cp:1")
    monkeypatch.delenv("AGENTRUN_WORKSPACE", raising=False)
    before = parse("--json", "--workspace", "w1", "runs", "list")
    assert (before.json, before.workspace, before.address) == (True, "w1", "cp:1")
    after = parse("runs", "list", "--json", "--address", "x:2")
    assert (after.json, after.workspace, after.address) == (True, "default", "x:2")


def test_publish_collects_tools_and_limits() -> None:
    args = parse(
        "agents",
        "publish",
        "demo",
        "--model",
        "m",
        "--instructions",
        "Be brief.",
        "--tool",
        "echo",
        "--tool",
        "sleep",
        "--max-steps",
        "5",
        "--deadline",
        "1.5",
    )
    assert args.tools == ["echo", "sleep"]
    assert (args.max_steps, args.deadline) == (5, 1.5)
    with pytest.raises(SystemExit):
        parse("agents", "publish", "demo", "--model", "m", "--instructions", "x")


def test_runs_list_rejects_unknown_status() -> None:
    with pytest.raises(SystemExit):
        parse("runs", "list", "--status", "sleeping")
    assert parse("runs", "list", "--status", "waiting", "--limit", "5").limit == 5


def test_server_passes_remaining_arguments_on() -> None:
    assert parse("server", "--verbose", "x").args == ["--verbose", "x"]
    assert parse("dev", "--demo").demo is True


def test_dev_listen_port_and_redacted_urls() -> None:
    assert launch._port("127.0.0.1:6000") == 6000
    assert launch._port("nonsense") == stack.DEFAULT_PORT
    assert stack.redact("postgresql://u:s3cret@h:5/db") == "postgresql://u:***@h:5/db"
    assert stack.redact("redis://h:6/0") == "redis://h:6/0"


def test_approval_steps_say_what_was_asked_and_who_decided():
    asked = run_pb2.Step(
        seq=5,
        kind=run_pb2.STEP_KIND_APPROVAL_REQUESTED,
        payload_json=json.dumps(
            {
                "tool": "send_email",
                "arguments": {"to": "ada@example.com"},
                "approval_id": "a1",
                "arguments_sha256": "ab" * 32,
            }
        ),
    )
    decided = run_pb2.Step(
        seq=6,
        kind=run_pb2.STEP_KIND_APPROVAL_DECIDED,
        payload_json=json.dumps(
            {"decision": "rejected", "decided_by": "bob", "via": "link", "reason": "wrong price"}
        ),
    )
    assert render.step_summary(asked).startswith('send_email {"to": "ada@example.com"} sha256=abab')
    assert render.step_summary(decided) == "rejected by bob via link: wrong price"
