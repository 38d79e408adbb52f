"""The chaos test (`make chaos`): hundreds of runs through all four providers while executors die.

Every run of the `chaos` scenario upserts a CRM contact (idempotent by email),
charges a card (payments: Idempotency-Key), then in one decision emails a
receipt (mail: lookup by a stamped header) and posts to chat (neither key nor
lookup). Meanwhile executors are killed with SIGKILL, both at random named
fault points (from inside) and at random moments (by this test), and the
providers drop responses after acting (resets and timeouts). The test plays
the person on call: it finds runs waiting for a decision through the API,
checks the chat channel as a person would, and says what happened.

It ends with every run completed, each side effect performed exactly once per
run, each in-doubt chat post surfaced as an unknown step that a person
decided, and prints its figures. `AGENTRUN_CHAOS_RUNS` changes the run count.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import (
    Api,
    AutoApprover,
    sandbox_effects,
    sandbox_requests,
    set_fault,
)
from tests.harness.idp import member_signed_in
from tests.harness.invariants import (
    assert_effects_at_most_once,
    assert_log_well_formed,
    assert_no_reask,
)
from tests.harness.processes import ManagedProcess, start_sandbox

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]

RUNS = int(os.environ.get("AGENTRUN_CHAOS_RUNS", "200"))
EXECUTORS = 3
TOOLS = ["crm_upsert", "create_charge", "send_email", "chat_post"]
WRITES = {
    "crm": "/crm/contacts/upsert",
    "payments": "/payments/charges",
    "mail": "/mail/send",
    "chat": "/chat/messages",
}
# Faults on each write endpoint, drawn at random per request (seeded). Dropped
# responses come after the side effect: a reset at once for payments and chat,
# a hang longer than the executors' tool timeout (a timeout) for CRM and mail.
# Errors (5xx) and rate limits come before it: the client cannot tell a 5xx apart.
FAULTS = [
    ("crm", "drop_response", 0.15, {"delay_ms": 1300}),
    ("crm", "rate_limit", 0.05, {"retry_after": 0.2}),
    ("payments", "drop_response", 0.2, {"delay_ms": 0}),
    ("payments", "error", 0.05, {"status": 500}),
    ("mail", "drop_response", 0.2, {"delay_ms": 1300}),
    ("mail", "error", 0.05, {"status": 502}),
    ("chat", "drop_response", 0.15, {"delay_ms": 0}),
    ("chat", "error", 0.05, {"status": 500}),
]
EXECUTOR_ENV = {
    "AGENTRUN_CAPACITY": "8",
    "AGENTRUN_TOOL_TIMEOUT_SECONDS": "1",
    "AGENTRUN_FAULTS_RANDOM": "0.006",
}
KILL_EVERY_SECONDS = 3.0
TERMINAL = (run_pb2.RUN_STATUS_COMPLETED, run_pb2.RUN_STATUS_FAILED, run_pb2.RUN_STATUS_CANCELLED)
DEADLINE_SECONDS = 420.0


@dataclass
class Chaos:
    """What happened, for the assertions and the printed figures."""

    self_kills: int = 0
    test_kills: int = 0
    decisions: Counter = field(default_factory=Counter)
    decided: set[tuple[str, int]] = field(default_factory=set)


@pytest.fixture
async def stack(db_url, control_plane, processes, sandbox_idp):
    providers = start_sandbox(processes, "providers")
    cp = control_plane(db_url, AGENTRUN_OIDC_ISSUER=sandbox_idp.url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("chaos", "chaos", TOOLS)
    for seed, (provider, mode, probability, extra) in enumerate(FAULTS):
        set_fault(
            providers.url,
            provider=provider,
            mode=mode,
            path=WRITES[provider],
            probability=probability,
            seed=seed,
            **extra,
        )
    md = await member_signed_in(db_url, sandbox_idp.url)
    async with AutoApprover(api, metadata=md):  # create_charge moves money: a person approves each
        yield cp, api, providers
    await api.close()


async def test_chaos_loses_no_run_and_repeats_no_side_effect(
    stack, executor_factory, sandbox_model
):
    cp, api, providers = stack
    rng = random.Random(2024)
    run_ids = [await api.start("chaos", f"lead-{i:03d}") for i in range(RUNS)]
    started = time.monotonic()
    chaos = Chaos()
    serial = iter(range(1, 10_000))

    def spawn() -> ManagedProcess:
        env = {**EXECUTOR_ENV, "AGENTRUN_FAULTS_SEED": str(next(serial))}
        (proc,) = executor_factory(cp, AGENTRUN_PROVIDERS_URL=providers.url, **env)
        return proc

    fleet = [spawn() for _ in range(EXECUTORS)]
    await drive(api, run_ids, fleet, spawn, providers.url, chaos, rng)
    runs = await api.wait_terminal(run_ids, within=30)
    elapsed = time.monotonic() - started

    lost = [r.run_id for r in runs if r.status != run_pb2.RUN_STATUS_COMPLETED]
    figures = await check_everything(api, run_ids, providers.url, sandbox_model.url, chaos)
    print_figures(len(run_ids), len(lost), elapsed, chaos, figures)
    assert lost == [], [(r.run_id, r.status, r.error) for r in runs if r.run_id in lost][:5]
    assert chaos.self_kills + chaos.test_kills > 0, "no executor died: nothing was exercised"
    assert sum(figures["dropped"].values()) > 0 and chaos.decisions, "no fault reached a person"


async def drive(api, run_ids, fleet, spawn, providers_url, chaos, rng) -> None:
    """Until every run ends: replace dead executors, kill one now and then, decide unknowns."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    next_kill = time.monotonic() + KILL_EVERY_SECONDS
    pending = set(run_ids)
    while pending and time.monotonic() < deadline:
        for i, proc in enumerate(fleet):
            if not proc.alive:
                assert proc.returncode == -9, proc.log_tail()
                chaos.self_kills += 1
                fleet[i] = spawn()
        victim = fleet[rng.randrange(len(fleet))]
        if time.monotonic() >= next_kill and victim.alive:
            victim.kill()
            chaos.test_kills += 1
            fleet[fleet.index(victim)] = spawn()
            next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * KILL_EVERY_SECONDS
        await decide_unknowns(api, providers_url, chaos)
        pending -= {r.run_id for r in await list_runs(api) if r.status in TERMINAL}
        await asyncio.sleep(0.5)  # a polling interval, not a synchronisation


async def list_runs(api: Api, status: int = 0) -> list[run_pb2.Run]:
    """Every run of the workspace (optionally of one status), through the API."""
    found, token = [], ""
    while True:
        page = await api.runs.ListRuns(
            run_pb2.ListRunsRequest(
                workspace_id=api.ws, page_size=500, page_token=token, status=status
            )
        )
        found += page.runs
        token = page.next_page_token
        if not token:
            return found


async def decide_unknowns(api: Api, providers_url: str, chaos: Chaos) -> None:
    """The person on call: for each run waiting on them, check the channel and decide."""
    waiting = await list_runs(api, run_pb2.RUN_STATUS_WAITING)
    for run in (r for r in waiting if r.wait_reason == "human"):
        unknown = await api.awaiting_person(run.run_id)
        if unknown is None:
            continue
        assert unknown.payload["tool"] == "chat_post", unknown.payload  # the only class none
        posts = {e["key"] for e in sandbox_effects(providers_url, "chat")}
        happened = f"{run.run_id}:{unknown.ref_seq}" in posts
        decision = "happened" if happened else "retry"
        # The decision records the caller's own principal (its key), not a typed name.
        await api.resolve_unknown(run.run_id, unknown.seq, decision, "", "checked #sales")
        chaos.decisions[decision] += 1
        chaos.decided.add((run.run_id, unknown.seq))


async def check_everything(api, run_ids, providers_url, model_url, chaos) -> dict:
    """Every invariant; returns the figures to print."""
    model_log = sandbox_requests(model_url)
    effects = sandbox_effects(providers_url)
    requests = sandbox_requests(providers_url)
    unknown_steps: set[tuple[str, int]] = set()
    started_keys: dict[str, tuple[str, int]] = {}
    for run_id in run_ids:
        steps = await api.steps(run_id)
        assert_log_well_formed(steps)
        assert_no_reask(run_id, steps, model_log)
        unknown_steps |= {
            (run_id, s.seq) for s in steps if s.kind == "tool_result" and s.payload.get("awaiting")
        }
        for s in steps:
            if s.kind == "tool_started":
                started_keys[s.payload["idempotency_key"]] = (run_id, s.seq)
    # Every unknown was visible through the API (the person found and decided each one).
    assert unknown_steps == chaos.decided
    duplicates = check_effects(run_ids, effects)
    dropped = Counter(r["provider"] for r in requests if r["fault"] == "drop_response")
    failed = Counter(r["provider"] for r in requests if r["fault"] in ("error", "rate_limit"))
    # Each chat post whose answer was lost surfaced as an unknown step, decided "happened".
    lost_posts = [r for r in requests if r["provider"] == "chat" and r["fault"] == "drop_response"]
    for request in lost_posts:
        run_id, seq = started_keys[request["idempotency_key"]]
        steps = {s.seq: s for s in await api.steps(run_id)}
        unknown = next(s for s in steps.values() if s.ref_seq == seq and s.kind == "tool_result")
        assert unknown.payload["status"] == "unknown", unknown.payload
        decision = next(s for s in steps.values() if s.ref_seq == unknown.seq)
        assert decision.payload["decision"] == "happened"
    resent = Counter(r["provider"] for r in requests if r["path"] in WRITES.values())
    return {
        "dropped": dropped,
        "failed": failed,
        "duplicates": duplicates,
        "unknowns": len(unknown_steps),
        "lookups": sum(r["path"] == "/mail/search" for r in requests),
        "write_requests": resent,
        "effects": Counter(e["provider"] for e in effects),
    }


def check_effects(run_ids: list[str], effects: list[dict]) -> dict[str, int]:
    """At most one side effect per key, and exactly one per run, at every provider."""
    duplicates = {}
    for provider in WRITES:
        mine = [e for e in effects if e["provider"] == provider]
        assert_effects_at_most_once(mine, provider)
        per_run = Counter(e["key"].rsplit(":", 1)[0] for e in mine)
        duplicates[provider] = sum(n - 1 for n in per_run.values() if n > 1)
        assert duplicates[provider] == 0, f"{provider}: a run acted twice: {per_run.most_common(3)}"
        assert set(per_run) == set(run_ids), f"{provider}: some runs never acted"
    return duplicates


def print_figures(runs: int, lost: int, elapsed: float, chaos: Chaos, figures: dict) -> None:
    effects, writes = figures["effects"], figures["write_requests"]
    print(
        f"\nchaos: runs={runs} completed={runs - lost} lost={lost} in {elapsed:.0f}s\n"
        f"  kills: {chaos.self_kills + chaos.test_kills} executors SIGKILLed "
        f"({chaos.self_kills} at random fault points, {chaos.test_kills} at random moments)\n"
        f"  dropped responses: {dict(figures['dropped'])}\n"
        f"  5xx and 429 answers: {dict(figures['failed'])}\n"
        f"  write requests / side effects: "
        + ", ".join(f"{p} {writes[p]}/{effects[p]}" for p in WRITES)
        + f"\n  lookups asked: {figures['lookups']}\n"
        f"  unknowns surfaced to a person: {figures['unknowns']} "
        f"(decided: {dict(chaos.decisions)})\n"
        f"  duplicates: {figures['duplicates']}"
    )
