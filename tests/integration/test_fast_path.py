"""The low-latency fast path (control_plane/dispatch/fast_path.py), with real processes: a
turn of a fast-path version goes from SendMessage straight to an executor with a free
slot (no claim; the response says it runs), falls back to the queue when none has one,
streams the model's text (OpenAI and Anthropic APIs) before the decision commits to
watchers on the executor's replica and on another one (LISTEN/NOTIFY between them), and
survives a kill -9 of its executor (the recovery scanner wakes the claim; no model
re-ask, no repeated tool call)."""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentrun.v1 import agent_pb2, run_pb2, session_pb2, session_pb2_grpc
from agentrun_cli.stack import SANDBOX_ANTHROPIC, sandbox_profiles
from control_plane.ground.config import ServerConfig
from control_plane.server import start as start_server
from tests.harness import secrets_seen
from tests.harness.agentrun_api import Api, sandbox_requests
from tests.harness.invariants import (
    assert_log_well_formed,
    assert_no_reask,
    assert_writes_at_most_once,
)
from tests.harness.waiting import eventually

WS = "ws"
TOKEN = secrets_seen.remember("scrape-fast-path-0123456789abcdef")


async def counter(cp, name: str, **labels: str) -> float:
    """A counter of the control plane's /metrics (summed over the matching samples)."""
    return await metric(cp, f"{name}_total", **labels)


async def metric(cp, name: str, **labels: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(
            f"{cp.http_url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}
        )
    reply.raise_for_status()
    return sum(
        s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def fast_session(
    api: Api, agent_id: str, model: str, tools: list[str], profile: str = ""
) -> str:
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id=agent_id))
    spec = agent_pb2.AgentSpec(
        model=model, instructions="fast", tools=tools, fast_path=True, model_profile=profile
    )
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=WS, agent_id=agent_id, spec=spec)
    )
    created = await sessions(api).CreateSession(
        session_pb2.CreateSessionRequest(workspace_id=WS, agent_id=agent_id, title="fast")
    )
    return created.session.session_id


async def free_slots(cp, at_least: int) -> bool:
    return await metric(cp, "agentrun_free_executor_slots") >= at_least


async def free_slot(cp) -> None:
    await eventually(lambda: free_slots(cp, 1), timeout=20, message="no executor with a free slot")


def sessions(api: Api) -> session_pb2_grpc.SessionServiceStub:
    return session_pb2_grpc.SessionServiceStub(api.channel)


async def send(api: Api, session_id: str, text: str) -> session_pb2.Turn:
    request = session_pb2.SendMessageRequest(workspace_id=WS, session_id=session_id, text=text)
    return (await sessions(api).SendMessage(request)).turn


async def test_fast_path_turns_skip_the_claim_stream_before_commit_and_survive_kill_9(
    db_url, control_plane, executor_factory, sandbox_model, sandbox_providers
):
    # Short leases; a claim only when poked (no poll for a minute): after the kill, only
    # the recovery scanner can wake the claim that takes the lapsed run over.
    cp = control_plane(
        db_url,
        AGENTRUN_METRICS_TOKEN=TOKEN,
        AGENTRUN_LEASE_SECONDS=3,
        AGENTRUN_HEARTBEAT_SECONDS=1,
        AGENTRUN_FAST_PATH_HEARTBEAT_SECONDS=0.5,
        AGENTRUN_CLAIM_POLL_SECONDS=60,
    )
    api = await Api.connect(cp.address, db_url, WS)
    # A second replica on the same database, in this process: no executor connects to it.
    other = await start_server(ServerConfig(database_url=db_url, listen="127.0.0.1:0"))
    elsewhere = await Api.connect(f"127.0.0.1:{other.port}", db_url, WS)
    try:
        session_id = await fast_session(api, "quick", "fast_chat", [])
        # No executor has a free slot: the turn is queued, and the claim takes it later.
        first = await send(api, session_id, "hello")
        assert first.status == run_pb2.RUN_STATUS_QUEUED
        assert await counter(cp, "agentrun_fast_path_turns", outcome="queued") == 1
        # Two slots: one is free whenever the next message comes. Its third decision
        # commit (the mail turn's tool call, below) kills it.
        (doomed,) = executor_factory(
            cp,
            AGENTRUN_CAPACITY=2,
            AGENTRUN_FAULTS="executor.decision.after_commit=kill@4",
            AGENTRUN_MODEL_PROFILES=sandbox_profiles(f"{sandbox_model.url}/v1"),
        )
        await api.wait_terminal([first.run_id], within=30)
        assert await counter(cp, "agentrun_claimed_runs", workspace=WS) == 1
        # The executor's connect ran the release's self-check before the claim took `first`
        # (the gate): its fast-path turn is the one dispatched so far.
        canary = await counter(cp, "agentrun_fast_path_turns", outcome="dispatched")
        assert canary == 1
        await free_slot(cp)

        second = await send(api, session_id, "again")
        assert second.status == run_pb2.RUN_STATUS_RUNNING  # as it is, not as admitted
        # Watched on the executor's replica and on the other one, both streamed to.
        await asyncio.gather(
            streams_before_it_commits(api, second.run_id),
            streams_before_it_commits(elsewhere, second.run_id),
        )
        # Dispatched by SendMessage itself: the claim never leased it.
        assert await counter(cp, "agentrun_claimed_runs", workspace=WS) == 1
        assert await counter(cp, "agentrun_fast_path_turns", outcome="dispatched") == canary + 1
        asked = [r for r in sandbox_requests(sandbox_model.url) if r["run_id"] == second.run_id]
        assert [r["stream"] for r in asked] == ["usage"]
        await streams_on_the_anthropic_api(cp, api, elsewhere, sandbox_model)

        await killed_and_taken_over(
            api, cp, doomed, executor_factory, sandbox_model, sandbox_providers
        )
    finally:
        await api.close()
        await elsewhere.close()
        await other.stop(grace=0)


async def streams_on_the_anthropic_api(cp, api: Api, elsewhere: Api, sandbox_model) -> None:
    """A turn on the Messages API streams too, to a watcher of the other replica."""
    session_id = await fast_session(api, "claude", "fast_chat", [], SANDBOX_ANTHROPIC)
    await free_slot(cp)
    turn = await send(api, session_id, "hello")
    assert turn.status == run_pb2.RUN_STATUS_RUNNING
    await streams_before_it_commits(elsewhere, turn.run_id)
    asked = [r for r in sandbox_requests(sandbox_model.url) if r["run_id"] == turn.run_id]
    assert [(r["api"], r["stream"]) for r in asked] == [("anthropic", "events")]


async def streams_before_it_commits(api: Api, run_id: str) -> None:
    events = await watch_with_deltas(api, run_id)
    kinds = [kind for kind, _ in events]
    assert kinds.index("delta") < kinds.index("model_decision") < kinds.index("completed")
    deltas = [event for kind, event in events if kind == "delta"]
    assert [d.index for d in deltas] == list(range(deltas[0].index, deltas[-1].index + 1))
    run = await api.get(run_id)
    assert run.output.endswith("".join(d.text for d in deltas)) and len(deltas) > 3


async def watch_with_deltas(api: Api, run_id: str) -> list[tuple[str, object]]:
    """WatchRun(deltas) to the end: ("delta", RunDelta), (step kind, Step) or ("completed",
    Run) in arrival order. At the first delta, the run has no decision step yet."""
    request = run_pb2.WatchRunRequest(workspace_id=WS, run_id=run_id, deltas=True)
    events: list[tuple[str, object]] = []
    async for event in api.runs.WatchRun(request, timeout=30):
        which = event.WhichOneof("event")
        if which == "delta":
            if not any(kind == "delta" for kind, _ in events):
                assert not [s for s in await api.steps(run_id) if s.kind == "model_decision"]
            events.append(("delta", event.delta))
        elif which == "step":
            events.append((run_pb2.StepKind.Name(event.step.kind)[10:].lower(), event.step))
        elif event.run.status == run_pb2.RUN_STATUS_COMPLETED:
            events.append(("completed", event.run))
    return events


async def killed_and_taken_over(api, cp, doomed, executor_factory, sandbox_model, providers):
    """A fast-path run whose executor dies after committing its tool call decision is
    taken over (epoch 2) and finished: the tool called once, the decision not asked again."""
    session_id = await fast_session(api, "mailer", "fast_mail", ["send_email"])
    # The heir is connected (one slot) before the turn: the fast path picks the executor
    # with more free slots, and nothing but the scanner pokes the claim after the kill.
    executor_factory(cp, AGENTRUN_CAPACITY=1)
    await eventually(lambda: free_slots(cp, 3), timeout=20, message="the heir never connected")
    turn = await send(api, session_id, "mail Ada")
    await eventually(lambda: not doomed.alive, timeout=20, message="the fault never fired")
    killed_at = time.monotonic()
    (run,) = await api.wait_terminal([turn.run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert time.monotonic() - killed_at < 20  # the poll alone would take a minute
    steps = await api.steps(turn.run_id)
    assert_log_well_formed(steps)
    assert_no_reask(turn.run_id, steps, sandbox_requests(sandbox_model.url))
    sends = assert_writes_at_most_once(
        [
            r
            for r in sandbox_requests(providers.url)
            if (r["idempotency_key"] or "").startswith(turn.run_id)
        ],
        "/mail/send",
    )
    assert sum(sends.values()) == 1
    decision = next(s for s in steps if s.kind == "model_decision")
    assert decision.epoch == 1 and steps[-1].epoch == 2  # fast-path lease, then takeover
    assert await counter(cp, "agentrun_fast_path_turns", outcome="dispatched") == 1 + 3  # canary
    assert await counter(cp, "agentrun_lease_takeovers", workspace=WS) == 1
