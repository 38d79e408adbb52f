"""/metrics' finished runs, durations, tokens and cost (issue 46) agree with the API exactly.

A control plane and an executor run as processes; RUNS runs end in all three ways (tool
calls then an answer, a reply cut off: failed, cancelled while queued, failed past their
max age by the control plane). The exposition must
pass Debian's `promtool check metrics` (the prometheus package; .ci/run installs it), and
every new series must equal what GetRun and ListRunSteps say: finished runs by agent and
status, tokens in and out, model plus tool cost, the run-duration histogram's count and sum,
and one step-duration observation per timed step. 200 runs, as the issue asks (about 18 s
here on two busy cores; the counts scale down in the constants below if the suite needs it).
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter

import httpx
import pytest
from google.protobuf.duration_pb2 import Duration

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api
from tests.harness.waiting import eventually
from tests.integration.test_metrics import TOKEN, Scrape, scrape

ECHOERS, CUTTERS, CANCELLED, SWEPT = 80, 55, 60, 5
RUNS = ECHOERS + CUTTERS + CANCELLED + SWEPT
STATUS = {
    run_pb2.RUN_STATUS_COMPLETED: "completed",
    run_pb2.RUN_STATUS_FAILED: "failed",
    run_pb2.RUN_STATUS_CANCELLED: "cancelled",
}


def promtool_check(text: str) -> None:
    if shutil.which("promtool") is None:  # .ci/run installs it; a bare machine may lack it
        pytest.skip("promtool (Debian's prometheus package) is missing: apt-get install prometheus")
    done = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_finished_runs_tokens_and_cost_on_metrics_agree_with_the_api(
    db_url, control_plane, executor_factory
):
    # No release self-check: its canary runs would add steps to the (workspace-free) step
    # durations.
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN, AGENTRUN_RELEASE_GATE="off")
    api = await Api.connect(cp.address, db_url, workspace="figures")
    try:
        await api.publish("echoer", "two_echoes", ["echo"])
        await api.publish("cutter", "cut_off", [])
        await api.publish("waiter", "chat", [])
        # Sleeps 6 s, past its max age: failed by the control plane, not by a commit.
        await api.publish("sleeper", "long_sleep", ["sleep"], max_age=Duration(seconds=2))
        cancelled = [await api.start("waiter") for _ in range(CANCELLED)]
        for run_id in cancelled:  # queued: no executor yet
            await api.runs.CancelRun(
                run_pb2.CancelRunRequest(workspace_id=api.ws, run_id=run_id, reason="test")
            )
        started = [await api.start("echoer") for _ in range(ECHOERS)]
        started += [await api.start("cutter") for _ in range(CUTTERS)]
        started += [await api.start("sleeper") for _ in range(SWEPT)]
        executor_factory(cp)
        runs = await api.wait_terminal(started + cancelled, within=120)
        steps = {r.run_id: await api.steps(r.run_id) for r in runs}
    finally:
        await api.close()
    ws = api.ws
    by = Counter((r.agent_id, STATUS[r.status]) for r in runs)
    assert by == {
        ("echoer", "completed"): ECHOERS,
        ("cutter", "failed"): CUTTERS,
        ("waiter", "cancelled"): CANCELLED,
        ("sleeper", "failed"): SWEPT,
    }, [r.error for r in runs if r.status == run_pb2.RUN_STATUS_FAILED][:3]
    assert {r.error for r in runs if r.agent_id == "sleeper"} == {"max age exceeded"}

    async def counted() -> Scrape:
        figures = await scrape(cp.http_url)
        assert figures.value("agentrun_runs_finished_total", workspace=ws) == RUNS
        return figures

    figures = await eventually(counted, timeout=15, message="the finished runs never all counted")

    for (agent, status), count in by.items():
        assert figures.value("agentrun_runs_finished_total", workspace=ws, agent=agent) == count
        assert figures.value("agentrun_runs_finished_total", agent=agent, status=status) == count
    for agent in ("echoer", "cutter", "waiter", "sleeper"):
        mine = [r for r in runs if r.agent_id == agent]
        tokens_in = sum(r.counters.input_tokens for r in mine)
        tokens_out = sum(r.counters.output_tokens for r in mine)
        cost = sum(r.counters.cost_micros for r in mine)
        assert figures.value("agentrun_tokens_total", workspace=ws, agent=agent, type="input") == (
            tokens_in
        )
        assert figures.value("agentrun_tokens_total", workspace=ws, agent=agent, type="output") == (
            tokens_out
        )
        spent = figures.value(
            "agentrun_model_cost_micros_total", workspace=ws, agent=agent
        ) + figures.value("agentrun_tool_cost_micros_total", workspace=ws, agent=agent)
        assert spent == cost
    assert sum(r.counters.input_tokens for r in runs) > 0
    assert sum(r.counters.cost_micros for r in runs) > 0
    # Labelled by the model each decision names (the sandbox's scenario names).
    assert figures.value("agentrun_tokens_total", workspace=ws, model="two_echoes") > 0

    # Run durations: one observation per run, summing its admission-to-finish times.
    for status in ("completed", "failed", "cancelled"):
        mine = [r for r in runs if STATUS[r.status] == status]
        count = figures.value("agentrun_run_duration_seconds_count", workspace=ws, status=status)
        assert count == len(mine)
        total = sum(
            (r.finish_time.ToNanoseconds() - r.create_time.ToNanoseconds()) / 1e9 for r in mine
        )
        seconds = figures.value("agentrun_run_duration_seconds_sum", workspace=ws, status=status)
        assert seconds == pytest.approx(total, abs=1e-3 * len(mine))

    # Step durations: one observation per timed step, each the duration its step records;
    # every model call and every call of a tool that was sent is timed.
    for kind in ("model_decision", "tool_result"):
        logged = [s for log in steps.values() for s in log if s.kind == kind]
        assert logged and all("duration_ms" in s.payload for s in logged)
        timed = [s.payload["duration_ms"] for s in logged]
        assert all(isinstance(ms, int) and ms >= 0 for ms in timed)
        assert figures.value("agentrun_step_duration_seconds_count", kind=kind) == len(timed)
        assert figures.value("agentrun_step_duration_seconds_sum", kind=kind) == pytest.approx(
            sum(timed) / 1000
        )

    # The whole exposition, these series in it, passes promtool's checks.
    async with httpx.AsyncClient(timeout=10) as http:
        raw = await http.get(f"{cp.http_url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    promtool_check(raw.text)
