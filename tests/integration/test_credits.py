"""Credits and cost per run, through the API: real control plane, executor, Postgres, sandbox.

Every run is priced from the table applied to the usage its steps record (computed here
from ListRunSteps and prices.json, not by the control plane's code); a metered workspace
pays out of reservations and the ledger balances to the micro; one out of credits stops
at its next step; one without an account is unlimited.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from decimal import Decimal

import grpc
import pytest

from agentrun.v1 import credit_pb2 as pb
from agentrun.v1 import run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.credits import Credits, assert_balanced, step_costs
from tests.harness.waiting import eventually


@pytest.fixture
async def stack(db_url, control_plane, executor_factory, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("echoer", "steps10", ["echo"])
    credits = await Credits.connect(api)
    executor_factory(cp)
    yield api, credits
    await credits.close()
    await api.close()


async def assert_priced(api: Api, run: run_pb2.Run) -> list[int]:
    """The run's cost and tokens are the table applied to its recorded usage."""
    steps = await api.steps(run.run_id)
    costs = step_costs(steps)
    decisions = [s.payload["usage"] for s in steps if s.kind == "model_decision"]
    assert run.counters.cost_micros == sum(costs) > 0
    assert run.counters.input_tokens == sum(u["prompt_tokens"] for u in decisions) > 0
    assert run.counters.output_tokens == sum(u["completion_tokens"] for u in decisions) > 0
    assert run.counters.cached_tokens == sum(u.get("cached_tokens", 0) for u in decisions)
    assert run.counters.reasoning_tokens == sum(u.get("reasoning_tokens", 0) for u in decisions)
    return costs


async def test_a_workspace_without_an_account_is_unlimited_and_still_priced(stack):
    api, credits = stack
    run_id = await api.start("echoer")
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED
    await assert_priced(api, run)
    assert (run.credits_reserved_micros, run.credit_chunks) == (0, 0)
    balance = await credits.balance()
    assert not balance.metered
    assert await credits.ledger() == []


async def test_metered_runs_reserve_in_chunks_and_the_ledger_balances(stack):
    api, credits = stack
    # Chunks smaller than a run's cost: every run tops up several times.
    await credits.grant(1_000_000, chunk_micros=500)
    run_ids = [await api.start("echoer") for _ in range(4)]
    runs = await api.wait_terminal(run_ids)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}
    for run in runs:
        costs = await assert_priced(api, run)
        assert run.credit_chunks >= 2
        # Only the run's last step (its final answer, paid at the provider) may overdraw.
        assert run.credits_reserved_micros > run.counters.cost_micros - max(costs)
    balance = await credits.balance()
    assert_balanced(balance, await credits.ledger(), runs)
    assert balance.balance_micros == 1_000_000 - sum(r.counters.cost_micros for r in runs)


async def test_a_workspace_out_of_credits_parks_at_its_next_step_and_a_grant_wakes_it(stack):
    api, credits = stack
    await credits.grant(700, chunk_micros=300)
    run_id = await api.start("echoer")

    async def parked() -> run_pb2.Run | None:
        run = await api.get(run_id)
        return run if run.wait_reason == "credits" else None

    run = await eventually(parked, timeout=30, message="the run never parked for credits")
    steps = await api.steps(run_id)
    assert steps[-1].kind == "park" and "out of credits" in steps[-1].payload["note"]
    # It stopped at the step that crossed the grant: every step before that one was covered,
    # and nothing was priced after it.
    costs = [c for c in step_costs(steps) if c]
    assert sum(costs[:-1]) < 700 <= sum(costs) == run.counters.cost_micros
    balance = await credits.balance()
    assert balance.balance_micros == 700 - run.counters.cost_micros <= 0
    assert_balanced(balance, await credits.ledger(), [run])

    await credits.grant(1_000_000)
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED
    await assert_priced(api, run)
    assert_balanced(await credits.balance(), await credits.ledger(), [run])


async def test_the_fail_policy_fails_the_run_with_the_reason(stack):
    api, credits = stack
    await credits.grant(400, chunk_micros=400, out_of_credits=pb.OUT_OF_CREDITS_FAIL)
    run_id = await api.start("echoer")
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_FAILED
    assert "out of credits" in run.error
    assert (await api.steps(run_id))[-1].kind == "finish"
    balance = await credits.balance()
    assert_balanced(balance, await credits.ledger(), [run])
    assert balance.reserved_micros == 0


async def test_grants_are_for_platform_admins_and_bad_ones_name_the_field(stack):
    api, credits = stack
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await credits.own.GrantCredits(pb.GrantCreditsRequest(workspace_id="ws", amount_micros=5))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    for request, field in [
        (pb.GrantCreditsRequest(workspace_id="ws", amount_micros=0), "amount_micros"),
        (pb.GrantCreditsRequest(workspace_id="ws", amount_micros=-3), "amount_micros"),
        (pb.GrantCreditsRequest(workspace_id="", amount_micros=5), "workspace_id"),
        (
            pb.GrantCreditsRequest(workspace_id="ws", amount_micros=5, chunk_micros=-1),
            "chunk_micros",
        ),
        (
            pb.GrantCreditsRequest(workspace_id="ws", amount_micros=5, out_of_credits=9),
            "out_of_credits",
        ),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await credits.admin.GrantCredits(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await credits.admin.GrantCredits(
            pb.GrantCreditsRequest(workspace_id="nope", amount_micros=5)
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert not (await credits.balance()).metered  # nothing was written
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await credits.own.ListCreditLedger(pb.ListCreditLedgerRequest(page_token="x"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_ledger_pages_newest_first(stack):
    api, credits = stack
    for amount in (1, 2, 3):
        await credits.grant(amount, note=f"grant {amount}")
    first = await credits.own.ListCreditLedger(pb.ListCreditLedgerRequest(page_size=2))
    assert [e.amount_micros for e in first.entries] == [3, 2]
    assert first.entries[0].granted_by == "platform:platform-admin"
    rest = await credits.own.ListCreditLedger(
        pb.ListCreditLedgerRequest(page_size=2, page_token=first.next_page_token)
    )
    assert [e.amount_micros for e in rest.entries] == [1]
    assert not rest.next_page_token
    balance = await credits.balance()
    assert (balance.granted_micros, balance.balance_micros) == (6, 6)


async def _cli(address: str, key: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env["AGENTRUN_API_KEY"] = key
    argv = [sys.executable, "-m", "agentrun_cli", "--address", address, "--workspace", "ws", *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


async def test_the_cli_grants_shows_the_balance_the_ledger_and_a_runs_cost(stack, db_url):
    api, credits = stack
    platform = await auth.platform_key(db_url, "ops-lead")
    reader = await auth.workspace_key(db_url, "ws", role="reader")
    out = await _cli(api.channel_target, reader, "credits", "balance")
    assert "unlimited" in out
    out = await _cli(
        api.channel_target,
        platform,
        "credits",
        "grant",
        "2.5",
        "--chunk",
        "0.001",
        "--when-out",
        "fail",
        "--note",
        "trial",
    )
    assert "balance   2.5" in out and "when out: fail" in out
    run_id = await api.start("echoer")
    (run,) = await api.wait_terminal([run_id])
    shown = await _cli(api.channel_target, reader, "runs", "show", run_id)
    cost = Decimal(run.counters.cost_micros) / 1_000_000
    assert f"cost      {cost:f} credits (reserved" in shown
    assert f"{run.counters.input_tokens} in" in shown
    ledger = await _cli(api.channel_target, reader, "credits", "ledger", "--run", run_id)
    names = {"grant", "reserve", "spend", "release"}
    kinds = [word for line in ledger.splitlines() for word in line.split() if word in names]
    assert kinds.count("release") == kinds.count("spend") == 1 and "reserve" in kinds
    grants = await _cli(api.channel_target, reader, "credits", "ledger")
    assert "by platform:ops-lead (trial)" in grants
