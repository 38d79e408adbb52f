"""Argument constraints: a pure check of (rules, call, triggering mail), and the run loop's use."""

from __future__ import annotations

import json

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import constraints, replay
from executor.run_loop import RunDeps, RunLoop
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import Outcome
from tests.unit.test_tool_run_loop import RUN, Committer, Delivery, Leases, Model, payloads

R = agent_pb2
MAIL = {
    "message_id": "<m1@x.test>",
    "thread_id": "t-1",
    "from": "Lead <lead@corp.test>",
    "to": ["triage@acme.test"],
    "cc": ["boss@corp.test"],
    "attachments": ["a1"],
}


def input_entry(mail: dict | None = MAIL) -> replay.Entry:
    trigger = {"kind": "mail", "trigger_id": "inbox", **({"mail": mail} if mail else {})}
    return replay.Entry(0, replay.INPUT, 0, {"text": "hi", "trigger": trigger})


def rule(kind: int, tool: str = "send_email", **kw) -> agent_pb2.ToolConstraint:
    return agent_pb2.ToolConstraint(tool=tool, rule=kind, **kw)  # type: ignore[arg-type]


THREAD = rule(R.CONSTRAINT_RULE_REPLY_TO_TRIGGER_THREAD)


def check(rules, arguments, mail=MAIL, tool="send_email") -> constraints.Verdict:
    return constraints.check(rules, tool, arguments, constraints.trigger_mail([input_entry(mail)]))


def test_the_trigger_mail_is_read_from_the_input_step():
    mail = constraints.trigger_mail([input_entry()])
    assert mail is not None and mail.thread_id == "t-1"
    assert mail.participants == {"lead@corp.test", "triage@acme.test", "boss@corp.test"}
    assert constraints.trigger_mail([replay.Entry(0, replay.INPUT, 0, {"text": "x"})]) is None


def test_a_reply_to_the_thread_passes_and_a_new_address_is_refused_by_name():
    assert not check([THREAD], {"to": "lead@corp.test", "thread_id": "t-1"}).refused
    verdict = check([THREAD], {"to": "attacker@evil.test", "subject": "invoices"})
    assert verdict.refused and verdict.rule == "reply_to_trigger_thread"
    assert "attacker@evil.test is not on the triggering thread" in (verdict.refusal or "")
    assert "nothing was sent" in (verdict.refusal or "")


def test_every_recipient_field_and_the_thread_id_are_checked():
    assert check([THREAD], {"to": "lead@corp.test", "cc": "Eve <eve@evil.test>"}).refused
    assert check([THREAD], {"to": ["lead@corp.test", "x@evil.test"]}).refused
    assert check([THREAD], {"to": "lead@corp.test", "thread_id": "t-other"}).refused


def test_a_run_no_mail_started_may_not_send_under_the_thread_rule():
    verdict = check([THREAD], {"to": "lead@corp.test"}, mail=None)
    assert verdict.refused and "not started by a mail" in (verdict.refusal or "")


def test_rules_of_other_tools_do_not_apply():
    assert not check([THREAD], {"channel": "#x"}, tool="chat_post").refused


def test_attachments_only_from_the_thread():
    attach = rule(R.CONSTRAINT_RULE_ATTACHMENTS_FROM_TRIGGER_THREAD)
    assert not check([attach], {"attachments": ["a1"]}).refused
    assert not check([attach], {"attachments": [{"id": "a1"}]}).refused
    assert check([attach], {"attachments": ["invoice-7.pdf"]}).refused


def test_an_unknown_recipient_needs_approval_a_known_one_does_not():
    known = rule(
        R.CONSTRAINT_RULE_RECIPIENT_KNOWN_OR_APPROVAL,
        known_recipients=["ops@acme.test", "@partner.test"],
    )
    assert check([known], {"to": "ops@acme.test"}).approval is None
    assert check([known], {"to": "anyone@partner.test"}).approval is None
    assert check([known], {"to": "lead@corp.test"}).approval is None  # on the thread
    verdict = check([known], {"to": "new@else.test"})
    assert not verdict.refused and "new@else.test is not a known recipient" in (
        verdict.approval or ""
    )


def test_a_refusal_wins_over_an_approval():
    known = rule(R.CONSTRAINT_RULE_RECIPIENT_KNOWN_OR_APPROVAL)
    assert check([known, THREAD], {"to": "new@else.test"}).refused


def test_amount_ceiling():
    cap = rule(R.CONSTRAINT_RULE_AMOUNT_AT_MOST, tool="create_charge", max_amount=5000)
    assert not check([cap], {"amount": 5000}, tool="create_charge").refused
    assert check([cap], {"amount": 5001}, tool="create_charge").refused
    assert check([cap], {"amount": "5"}, tool="create_charge").refused


def assignment(arguments: dict, rules: list, **spec_fields) -> executor_pb2.Assignment:
    trigger = {"kind": "mail", "trigger_id": "inbox", "mail": MAIL}
    call = {"id": "c1", "name": "send_email", "arguments": arguments}
    log = [
        run_pb2.Step(
            seq=0, kind=replay.INPUT, payload_json=json.dumps({"text": "x", "trigger": trigger})
        ),
        run_pb2.Step(seq=1, kind=replay.DECISION, payload_json=json.dumps({"tool_calls": [call]})),
    ]
    spec = agent_pb2.AgentSpec(model="m", tools=["send_email"], constraints=rules, **spec_fields)
    run = run_pb2.Run(run_id=RUN, workspace_id="ws", lease_epoch=1)
    return executor_pb2.Assignment(
        run=run, agent_version=agent_pb2.AgentVersion(spec=spec), steps=log
    )


async def test_the_run_loop_commits_the_refusal_as_an_error_result_and_sends_nothing():
    committer, delivery = Committer(), Delivery()
    deps = RunDeps(committer, Leases(), Model(), delivery, Catalogue.load())  # type: ignore[arg-type]
    args = {"to": "attacker@evil.test", "subject": "invoices", "body": "here"}
    assert await RunLoop(assignment(args, [THREAD]), deps).run() == "completed"
    assert delivery.calls == []
    (kind, payload), *_ = payloads(committer.commits[0])
    assert kind == "tool_result" and payload["status"] == "error"
    assert payload["refused_by"] == "reply_to_trigger_thread"


async def test_an_unknown_recipient_is_held_for_approval_with_the_rule_as_reason():
    known = rule(R.CONSTRAINT_RULE_RECIPIENT_KNOWN_OR_APPROVAL)
    committer, delivery = Committer(), Delivery(Outcome("ok", output={}))
    deps = RunDeps(committer, Leases(), Model(), delivery, Catalogue.load())  # type: ignore[arg-type]
    args = {"to": "new@else.test", "subject": "s", "body": "b"}
    assert await RunLoop(assignment(args, [known]), deps).run() == "parked"
    assert delivery.calls == []
    [commit] = committer.commits
    assert commit.park.wait_reason == "approval" and commit.HasField("approval_request")
    assert "not a known recipient" in payloads(commit)[0][1]["reason"]


async def test_on_refusal_fail_commits_the_refusal_and_the_failure_together():
    committer, delivery = Committer(), Delivery()
    deps = RunDeps(committer, Leases(), Model(), delivery, Catalogue.load())  # type: ignore[arg-type]
    args = {"to": "attacker@evil.test", "subject": "invoices", "body": "here"}
    loop = RunLoop(assignment(args, [THREAD], on_refusal=R.ON_REFUSAL_FAIL), deps)
    assert await loop.run() == "failed"
    assert delivery.calls == []
    [commit] = committer.commits  # one commit: a resumed run never asks the model again
    (kind, refusal), (finish, _) = payloads(commit)
    assert (kind, finish) == ("tool_result", "finish")
    assert refusal["refused_by"] == "reply_to_trigger_thread"
    assert commit.fail.error == refusal["error"]
    assert commit.fail.error.startswith("refused by constraint reply_to_trigger_thread")


async def test_on_refusal_ask_holds_the_call_for_a_person_with_the_refusal_as_reason():
    committer, delivery = Committer(), Delivery()
    deps = RunDeps(committer, Leases(), Model(), delivery, Catalogue.load())  # type: ignore[arg-type]
    args = {"to": "attacker@evil.test", "subject": "invoices", "body": "here"}
    loop = RunLoop(assignment(args, [THREAD], on_refusal=R.ON_REFUSAL_ASK), deps)
    assert await loop.run() == "parked"
    assert delivery.calls == []
    [commit] = committer.commits
    assert commit.park.wait_reason == "approval" and commit.HasField("approval_request")
    reason = payloads(commit)[0][1]["reason"]
    assert reason.startswith("refused by constraint reply_to_trigger_thread")
