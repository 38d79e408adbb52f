"""A control-plane crash costs nothing: two replicas, one killed with SIGKILL every few
seconds while runs make HTTP tool calls that take 600 ms at their providers.

The executors know both replicas' addresses (one gRPC target, `ipv4:a,b`): when the one
they stream to dies they reconnect to the other and keep their runs' leases (Hello.held).
A lease carried over a reconnect may commit but never send (executor/horizon.py), so a
call caught between its `tool_started` commit and its request hands the run back, known
unsent, and the next holder sends it under the same key. What the test holds the platform
to, counted at the providers and in the logs:

* every tool call's effect happened exactly once (upserts, mails and chat posts equal to
  the runs' calls; the chat provider has no key, so a second post would show);
* no result says "not sent" (our own stream is never a tool's outcome), no call is left
  unknown, nothing was re-asked, no epoch went back in a log.

`AGENTRUN_TEST_REPLICA_RUNS` and `AGENTRUN_TEST_REPLICA_KILLS` scale it (defaults 48, 5).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
from collections import Counter

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import (
    Api,
    clear_faults,
    sandbox_effects,
    sandbox_requests,
    set_fault,
)
from tests.harness.invariants import assert_log_well_formed, assert_no_reask
from tests.harness.waiting import eventually
from tests.integration.test_takeover import logged

RUNS = int(os.environ.get("AGENTRUN_TEST_REPLICA_RUNS", "48"))
KILLS = int(os.environ.get("AGENTRUN_TEST_REPLICA_KILLS", "5"))
TOOLS = ["crm_upsert", "send_email", "chat_post"]
PROVIDER_DELAY_MS = 600
# Per run, what the replica_writes scenario does at each provider.
EXPECTED = {"crm": 2, "mail": 1, "chat": 1}


async def _load_while_killing(api: Api, replicas: tuple, tag: str) -> list[str]:
    """Start RUNS runs, one every 0.25 s, while a replica (each in turn) is killed with
    SIGKILL every 1.5-3 s and restarted 0.3-1 s later; the runs' ids."""
    run_ids: list[str] = []

    async def feed() -> None:  # runs keep arriving, so calls are in flight at every kill
        for i in range(RUNS):
            run_ids.append(await api.start("replicas", f"lead{tag}n{i}"))
            await asyncio.sleep(0.25)

    feeder = asyncio.create_task(feed())
    rng = random.Random(39)
    for kill in range(KILLS):
        await asyncio.sleep(rng.uniform(1.5, 3.0))
        victim = replicas[kill % 2]
        victim.kill()
        await asyncio.sleep(rng.uniform(0.3, 1.0))
        victim.restart()
    await feeder
    return run_ids


async def _check_logs(api: Api, run_ids: list[str], model_log: list[dict]) -> int:
    """Each run's log well formed (no epoch going back: no stale write), nothing re-asked,
    no result saying "not sent", nothing left unknown; how many calls were handed back
    known unsent."""
    not_sent, unknown, handed_back = [], [], 0
    for run_id in run_ids:
        steps = await api.steps(run_id)
        assert_log_well_formed(steps)
        assert_no_reask(run_id, steps, model_log)
        handed_back += sum(s.kind == "park" and "unsent_call_seq" in s.payload for s in steps)
        results = [s for s in steps if s.kind == "tool_result"]
        not_sent += [
            (run_id, s.seq, s.payload.get("error"))
            for s in results
            if "not sent" in str(s.payload.get("error") or "")
        ]
        unknown += [(run_id, s.seq) for s in results if s.payload.get("status") == "unknown"]
    assert not_sent == [], f"our own transport became a tool's outcome: {not_sent[:5]}"
    assert unknown == [], f"calls left unknown: {unknown[:5]}"
    return handed_back


def _check_effects(providers_url: str, run_ids: list[str]) -> None:
    """Each run's calls took effect exactly once at each provider."""
    ids = set(run_ids)
    for provider, per_run in EXPECTED.items():
        effects = [
            e
            for e in sandbox_effects(providers_url, provider)
            if str(e.get("key") or "").split(":")[0] in ids
        ]
        by_run = Counter(str(e["key"]).split(":")[0] for e in effects)
        wrong = {r: by_run[r] for r in run_ids if by_run[r] != per_run}
        assert wrong == {}, f"{provider}: runs whose effects are not {per_run}: {wrong}"
        repeated = {k: n for k, n in Counter(e["key"] for e in effects).items() if n > 1}
        assert repeated == {}, f"{provider}: effects repeated: {repeated}"


async def test_killing_a_replica_under_load_leaves_every_call_made_exactly_once(
    db_url, control_plane, executor_factory, sandbox_model, sandbox_providers
):
    first, second = control_plane(db_url), control_plane(db_url)
    # The test's own calls go to a third replica, never killed (the executors don't know it).
    api = await Api.connect(control_plane(db_url).address, db_url)
    await api.publish("replicas", "replica_writes", TOOLS)
    for provider in EXPECTED:
        set_fault(
            sandbox_providers.url, provider=provider, mode="delay", delay_ms=PROVIDER_DELAY_MS
        )
    set_fault(sandbox_model.url, delay_ms=150)
    both = f"ipv4:{first.address},{second.address}"
    executors = executor_factory(first, count=3, AGENTRUN_CONTROL_PLANE=both, AGENTRUN_CAPACITY=4)
    try:
        for proc in executors:
            await eventually(
                lambda proc=proc: logged(proc, "connected to control plane"),
                timeout=30,
                message=f"{proc.name} never connected",
            )
        # The CRM keeps contacts across tests: new leads each time.
        run_ids = await _load_while_killing(api, (first, second), secrets.token_hex(3))
        runs = await api.wait_terminal(run_ids, within=180)
    finally:
        clear_faults(sandbox_providers.url)
        clear_faults(sandbox_model.url)

    failed = {r.run_id: r.error for r in runs if r.status != run_pb2.RUN_STATUS_COMPLETED}
    assert failed == {}, failed
    reconnects = sum(logged(p, "connected to control plane") for p in executors) - len(executors)
    assert reconnects >= KILLS, "the kills did not reach the executors' streams"
    handed_back = await _check_logs(api, run_ids, sandbox_requests(sandbox_model.url))
    print(
        f"{len(run_ids)} runs, {KILLS} replica kills, {reconnects} reconnects, "
        f"{handed_back} calls handed back known unsent (sent by the next holder)"
    )
    _check_effects(sandbox_providers.url, run_ids)
    await api.close()
