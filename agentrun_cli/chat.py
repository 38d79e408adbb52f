"""`agentrun chat AGENT`: a conversation in the terminal, one turn at a time.

Each line you type is sent to the session (SessionService.SendMessage); the
server starts the turn's run and the chat streams its steps (WatchRun) until
the run ends, then prints the answer and asks for the next line. A turn that
waits for a person's approval says so: the held call, who may decide, until when, and
the commands that decide it. The server
refuses a message while a turn is still running (ABORTED), which a second
terminal on the same session (`--session ID`) would see. Ctrl-D ends the chat;
the session stays and can be resumed with `--session`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TextIO

import grpc

from agentrun.v1 import approval_pb2, approval_pb2_grpc, run_pb2, session_pb2, session_pb2_grpc
from agentrun_cli import render, triggers
from agentrun_cli.client import Client

TIMEOUT = 30.0
PROMPT = "you> "
STRATEGIES = {
    "reject": session_pb2.SESSION_STRATEGY_REJECT,
    "enqueue": session_pb2.SESSION_STRATEGY_ENQUEUE,
    "interrupt": session_pb2.SESSION_STRATEGY_INTERRUPT,
    "rollback": session_pb2.SESSION_STRATEGY_ROLLBACK,
}


class Chat:
    """One terminal conversation: send a line, stream the turn, print the answer."""

    def __init__(
        self, client: Client, out: TextIO = sys.stdout, strategy: str = "", priority: int = 0
    ) -> None:
        self.client = client
        # The session strategy (--strategy): the new session's, and each message's.
        self.strategy = STRATEGIES[strategy] if strategy else 0
        # The priority of each turn's run (--priority).
        self.priority = priority
        self.sessions = session_pb2_grpc.SessionServiceStub(client.channel)
        self.approvals = approval_pb2_grpc.ApprovalServiceStub(client.channel)
        self.out = out

    def open(self, agent_id: str, session_id: str, title: str) -> str:
        ws = self.client.workspace
        if session_id:
            req = session_pb2.GetSessionRequest(workspace_id=ws, session_id=session_id)
            session = self.sessions.GetSession(req, timeout=TIMEOUT).session
            self._say(f"(resuming session {session.session_id}, {session.turn_count} turns so far)")
            return session.session_id
        req = session_pb2.CreateSessionRequest(
            workspace_id=ws, agent_id=agent_id, title=title, strategy=self.strategy
        )
        session = self.sessions.CreateSession(req, timeout=TIMEOUT).session
        self._say(f"(session {session.session_id} with {agent_id}; Ctrl-D to leave)")
        return session.session_id

    def turn(self, session_id: str, text: str) -> run_pb2.Run | None:
        """Send one message and follow its run to the end; None when the server refused it."""
        req = session_pb2.SendMessageRequest(
            workspace_id=self.client.workspace,
            session_id=session_id,
            text=text,
            strategy=self.strategy,
            priority=self.priority,
        )
        try:
            turn = self.sessions.SendMessage(req, timeout=TIMEOUT).turn
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.INVALID_ARGUMENT):
                self._say(f"(not sent: {err.details()})")
                return None
            raise
        watch = self.client.watch(turn.run_id)
        told: set[str] = set()  # approvals already announced
        for event in watch:
            if event.HasField("step") and event.step.kind != run_pb2.STEP_KIND_INPUT:
                self._say(f"  · {render.step_summary(event.step)}")
            elif event.HasField("run") and _waits_for_approval(event.run):
                self._announce_approvals(event.run.run_id, told)
        run = watch.run
        if run is not None and run.status == run_pb2.RUN_STATUS_COMPLETED:
            self._say(f"agent> {run.output}")
        elif run is not None:
            self._say(f"(turn {render.status_name(run.status)}: {run.error})")
        return run

    def loop(self, session_id: str, read: Callable[[str], str]) -> None:
        while True:
            try:
                line = read(PROMPT).strip()
            except EOFError:
                self._say("")
                return
            if line:
                self.turn(session_id, line)

    def _announce_approvals(self, run_id: str, told: set[str]) -> None:
        """Say what the turn waits for: each pending approval of its run, once."""
        req = approval_pb2.ListApprovalsRequest(
            workspace_id=self.client.workspace,
            state=approval_pb2.APPROVAL_STATE_PENDING,
            page_size=500,
        )
        found = self.approvals.ListApprovals(req, timeout=TIMEOUT).approvals
        waiting = [a for a in found if a.run_id == run_id and a.approval_id not in told]
        if not waiting and not told:
            self._say("(waiting for an approval: `agentrun approvals list` shows it)")
        for approval in waiting:
            told.add(approval.approval_id)
            for line in approval_lines(approval):
                self._say(line)

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def _waits_for_approval(run: run_pb2.Run) -> bool:
    return run.status == run_pb2.RUN_STATUS_WAITING and run.wait_reason.startswith("approval")


def approval_lines(a: approval_pb2.Approval) -> list[str]:
    """What a chat says while its turn waits for `a`: the call held, who may decide it, until
    when, and how (a high-risk or money-moving call needs a signed-in approver)."""
    arguments = render.short(json.loads(a.arguments_json or "null"), 80)
    who = ", ".join(a.approvers) or "the workspace's admins"
    until = f" until {render.timestamp(a.expire_time)}" if a.HasField("expire_time") else ""
    signed_in = a.high_risk or a.moves_money
    how = (
        "signed in: in the console, or"
        if signed_in
        else "in the console, or with an approver's key:"
    )
    token = " --token ID_TOKEN" if signed_in else ""
    return [
        f"(waiting for approval {a.approval_id}: {a.tool} {arguments})",
        f"  who may decide: {who}{until}; {how}",
        f"    agentrun approvals approve {a.approval_id}{token}",
        f"    agentrun approvals reject {a.approval_id}{token} --reason '…'",
    ]


def _read_line(prompt: str) -> str:
    if sys.stdin.isatty():
        return input(prompt)
    line = sys.stdin.readline()  # piped: no prompt echo, EOF at the end
    if not line:
        raise EOFError
    return line


def chat(args: argparse.Namespace) -> int:
    with Client(args.address, args.workspace) as client:
        conversation = Chat(client, strategy=args.strategy, priority=args.priority)
        session_id = conversation.open(args.agent_id, args.session, args.title)
        conversation.loop(session_id, _read_line)
    return 0


def add_command(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("chat", help="talk to an agent, turn by turn", parents=[common])
    p.add_argument("agent_id", metavar="AGENT")
    p.add_argument("--session", default="", metavar="ID", help="resume a session")
    p.add_argument("--title", default="", help="a title for a new session")
    p.add_argument(
        "--strategy",
        default="",
        choices=sorted(STRATEGIES),
        help="what a message sent while a turn runs does (a new session's, and each message's)",
    )
    triggers.add_priority(p)  # each turn's run's
    p.set_defaults(handler=chat)
