"""Approvals end to end: real executors hold the call, a human decides, the model sees it.

The admin's key publishes and starts; the approver decides as themselves (the
request names nobody): with their own approver key, or signed in at the sandbox
IdP as a member of the workspace.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import grpc
import pytest

from agentrun.v1 import approval_pb2, approval_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, pending_approval, sent_mail
from tests.harness.idp import add_member, signed_in

APPROVER = "manager@example.com"


class Approvals:
    """The approval service as the approver calls it (their key, or signed-in metadata)."""

    def __init__(self, stub: approval_pb2_grpc.ApprovalServiceStub, metadata) -> None:
        self.stub, self.metadata = stub, metadata

    async def ListApprovals(self, req):
        return await self.stub.ListApprovals(req, metadata=self.metadata)

    async def DecideApproval(self, req):
        return await self.stub.DecideApproval(req, metadata=self.metadata)


@pytest.fixture
async def stack(request, db_url, db, control_plane, sandbox_model, sandbox_providers, sandbox_idp):
    """The control plane, an admin's Api, and the approval service as the approver calls it:
    with their own approver key (send_email is an ordinary tool), or signed in at the IdP
    as a member of the workspace (`indirect` param "signed_in")."""
    cp = control_plane(db_url, AGENTRUN_OIDC_ISSUER=sandbox_idp.url)
    api = await Api.connect(cp.address, db_url)
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[APPROVER])
    await api.publish("mailer", "approval", ["send_email"], approval=policy)
    if getattr(request, "param", "key") == "signed_in":
        await add_member(db, "ws", APPROVER, "approver")
        channel = auth.channel(cp.address, None)
        metadata = await signed_in(sandbox_idp.url, APPROVER)
    else:  # an admin key may not decide: the approver's own key does
        key = await auth.workspace_key(db_url, api.ws, role="approver", principal=APPROVER)
        channel, metadata = auth.channel(cp.address, key), None
    approvals = Approvals(approval_pb2_grpc.ApprovalServiceStub(channel), metadata)
    yield cp, api, approvals
    await channel.close()
    await api.close()


async def decide(approvals, approval_id: str, **decision):
    return await approvals.DecideApproval(
        approval_pb2.DecideApprovalRequest(workspace_id="ws", approval_id=approval_id, **decision)
    )


@pytest.mark.parametrize("stack", ["key", "signed_in"], indirect=True)
async def test_the_call_waits_with_no_executor_and_runs_exactly_as_approved(
    stack, executor_factory, sandbox_providers
):
    cp, api, approvals = stack
    run_id = await api.start("mailer", "email ada")
    executor_factory(cp)
    approval = await pending_approval(api, approvals, run_id, APPROVER)
    run = await api.get(run_id)
    assert run.lease_owner == "" and not run.HasField("wake_time")  # held by nobody
    args = json.loads(approval.arguments_json)
    assert args["to"] == "ada@example.com" and sent_mail(sandbox_providers.url, run_id) == []

    await decide(approvals, approval.approval_id, approve=approval_pb2.Approve())
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    (mail,) = sent_mail(sandbox_providers.url, run_id)
    assert {k: mail["body"][k] for k in args} == args


async def test_a_rejection_reaches_the_model_as_a_result(
    stack, executor_factory, sandbox_providers
):
    cp, api, approvals = stack
    run_id = await api.start("mailer", "email ada")
    executor_factory(cp)
    approval = await pending_approval(api, approvals, run_id, APPROVER)
    await decide(
        approvals,
        approval.approval_id,
        reject=approval_pb2.Reject(reason="wrong price, use the 2026 list"),
    )
    (run,) = await api.wait_terminal([run_id])
    assert run.output == "The email tool said: rejected: wrong price, use the 2026 list"
    assert sent_mail(sandbox_providers.url, run_id) == []


async def test_an_edit_runs_the_humans_arguments_and_the_model_sees_it(
    stack, executor_factory, sandbox_providers
):
    cp, api, approvals = stack
    run_id = await api.start("mailer", "email ada")
    executor_factory(cp)
    approval = await pending_approval(api, approvals, run_id, APPROVER)
    edited = {**json.loads(approval.arguments_json), "body": "Hi Ada, the 2026 price is 90."}
    await decide(
        approvals,
        approval.approval_id,
        edit=approval_pb2.Edit(arguments_json=json.dumps(edited), note="fix the price"),
    )
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    (mail,) = sent_mail(sandbox_providers.url, run_id)
    assert mail["body"]["body"] == "Hi Ada, the 2026 price is 90."
    assert "edited the arguments before it ran (fix the price)" in run.output
    assert "the 2026 price is 90" in run.output


async def test_tampered_arguments_are_refused_before_the_tool_is_called(
    stack, executor_factory, sandbox_providers, db
):
    cp, api, approvals = stack
    run_id = await api.start("mailer", "email ada")
    (first,) = executor_factory(cp)
    approval = await pending_approval(api, approvals, run_id, APPROVER)
    first.kill()  # nobody may pick the run up until the log is tampered with
    await decide(approvals, approval.approval_id, approve=approval_pb2.Approve())
    # An attacker with database access rewrites the approved recipient.
    await db.execute(
        """UPDATE steps SET payload = jsonb_set(payload, '{arguments,to}', '"evil@example.com"')
           WHERE run_id = $1 AND kind = 'approval_decided'""",
        run_id,
    )
    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id])
    assert "hash mismatch" in run.output
    assert sent_mail(sandbox_providers.url, run_id) == []


async def test_a_second_decision_is_aborted_naming_the_winner(stack, executor_factory):
    cp, api, approvals = stack
    run_id = await api.start("mailer", "email ada")
    executor_factory(cp)
    approval = await pending_approval(api, approvals, run_id, APPROVER)
    await decide(approvals, approval.approval_id, approve=approval_pb2.Approve())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await decide(approvals, approval.approval_id, reject=approval_pb2.Reject(reason="late"))
    assert info.value.code() == grpc.StatusCode.ABORTED
    assert f"approved by {APPROVER}" in info.value.details()


async def test_agentrun_chat_says_what_its_turn_waits_for_and_goes_on_once_decided(
    stack, db_url, executor_factory, sandbox_providers
):
    """A chat turn held at an approval used to print nothing and sit there: it names the
    call, who may decide it, until when and the commands that do; then, approved, the
    turn ends with the answer."""
    cp, api, approvals = stack
    executor_factory(cp)
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="chatter")
    env = {**os.environ, "AGENTRUN_API_KEY": key}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "agentrun_cli", "--address", cp.address, "--workspace", "ws"),
        *("chat", "mailer"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"write to Ada\n")
    await proc.stdin.drain()
    said: list[str] = []
    while not any(line.startswith("    agentrun approvals reject") for line in said):
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        assert line, f"the chat ended: {said}"
        said.append(line.decode().rstrip("\n"))
    waiting = [line for line in said if line.startswith("(waiting for approval")]
    assert len(waiting) == 1, said
    approval_id = waiting[0].split()[3].rstrip(":")
    assert waiting[0].startswith(f"(waiting for approval {approval_id}: send_email {{"), said
    assert '"to": "ada@example.com"' in waiting[0]
    who = said[said.index(waiting[0]) + 1]
    assert who.startswith(f"  who may decide: {APPROVER} until ") and who.endswith(
        "in the console, or with an approver's key:"
    ), who
    assert said[-2:] == [
        f"    agentrun approvals approve {approval_id}",
        f"    agentrun approvals reject {approval_id} --reason '…'",
    ]
    await decide(approvals, approval_id, approve=approval_pb2.Approve())
    out, err = await asyncio.wait_for(proc.communicate(b""), timeout=60)
    assert proc.returncode == 0, err.decode()
    assert "agent> The email tool said:" in out.decode(), out.decode()
