"""/metrics of real processes under a small load: the figures move, and agree with the database.

A control plane and executors run as processes; runs sleep (parks), hit a provider's 429
(a rate park), wait for approval, and lose their executor to a kill -9 (lease takeovers and
unknown outcomes). The test reads both endpoints with prometheus_client's parser and checks
each figure against what the API says happened.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentrun.v1 import run_pb2
from tests.harness import secrets_seen
from tests.harness.agentrun_api import Api, clear_faults, set_fault
from tests.harness.auth import platform_key, workspace_key
from tests.harness.waiting import eventually

# The scrape token is a credential: the session's log scan fails the run if a log holds it.
TOKEN = secrets_seen.remember(f"scrape-{secrets.token_hex(16)}")
SLEEPERS = 4

# The release self-check's runs (deploys/canary.py): the contract run and two turns.
CANARY_RUNS = 3


class Scrape:
    """One exposition, parsed."""

    def __init__(self, text: str) -> None:
        self.samples = [
            (sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
        return sum(
            v
            for n, got, v in self.samples
            if n == name and all(got.get(k) == want for k, want in labels.items())
        )

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


async def scrape(url: str, token: str = TOKEN) -> Scrape:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(f"{url}/metrics", headers={"authorization": f"Bearer {token}"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return Scrape(reply.text)


def executor_metrics_env(tmp_path, name: str) -> dict[str, str]:
    return {
        "AGENTRUN_METRICS_LISTEN": "127.0.0.1:0",
        "AGENTRUN_METRICS_PORT_FILE": str(tmp_path / f"{name}.metrics-port"),
        "AGENTRUN_METRICS_TOKEN": TOKEN,
    }


def unfinished(figures: Scrape, ws: str) -> float:
    return figures.value("agentrun_runs", workspace=ws)


async def test_metrics_need_the_scrape_token_or_a_platform_key(db_url, control_plane):
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN)
    admin = await workspace_key(db_url, "ws", role="admin")
    platform = await platform_key(db_url)
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=10) as http:
        assert (await http.get("/metrics")).status_code == 401
        wrong = await http.get("/metrics", headers={"authorization": "Bearer scrape-wrong"})
        assert wrong.status_code == 401
        # A workspace's own admin may not read every workspace's figures.
        refused = await http.get("/metrics", headers={"authorization": f"Bearer {admin}"})
        assert refused.status_code == 403
        assert "AGENTRUN_METRICS_TOKEN" in refused.json()["error"]
    for credential in (TOKEN, platform):
        figures = await scrape(cp.http_url, credential)
        assert {"agentrun_database_up", "agentrun_outbox_backlog"} <= figures.names()
        assert figures.value("agentrun_database_up") == 1


async def test_metrics_scraped_during_a_load_follow_the_runs(
    db_url, control_plane, executor_factory, sandbox_providers, tmp_path
):
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN)
    api = await Api.connect(cp.address, db_url)
    try:
        await api.publish("sleeper", "sleepy", ["sleep", "echo"])
        await api.publish("poster", "poster", ["chat_post"])
        sleepers = [await api.start("sleeper") for _ in range(SLEEPERS)]
        poster = await api.start("poster")
        set_fault(
            sandbox_providers.url,
            provider="chat",
            mode="rate_limit",
            retry_after=1,
            count=1,
            key_prefix=f"{poster}:",
        )

        async def queued() -> bool:
            figures = await scrape(cp.http_url)
            return figures.value("agentrun_runs", workspace=api.ws, status="queued") == 5

        await eventually(queued, timeout=10, message="the queued runs never showed")
        env = executor_metrics_env(tmp_path, "executor-1")
        (executor,) = executor_factory(cp, AGENTRUN_RATE_COOLDOWN_SECONDS="2", **env)

        async def sleeping() -> bool:  # the figures move while the runs do
            figures = await scrape(cp.http_url)
            return figures.value("agentrun_runs", workspace=api.ws, wait_reason="sleep") > 0

        await eventually(sleeping, timeout=20, message="no run was ever seen sleeping")
        runs = await api.wait_terminal([*sleepers, poster], within=60)
    finally:
        clear_faults(sandbox_providers.url)
        await api.close()
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}, [r.error for r in runs]

    async def settled() -> Scrape:
        figures = await scrape(cp.http_url)
        assert unfinished(figures, api.ws) == 0
        return figures

    figures = await eventually(settled, timeout=10)
    ws = api.ws
    # Every hold is one claim and bumps the epoch once: the counter is the log's truth.
    assert figures.value("agentrun_claimed_runs_total", workspace=ws) == sum(
        r.lease_epoch for r in runs
    )
    assert figures.value("agentrun_claim_seconds_count") >= 2
    assert figures.value("agentrun_parks_total", workspace=ws, reason="sleep") == SLEEPERS
    assert figures.value("agentrun_parks_total", workspace=ws, reason="rate") == 1
    assert figures.value("agentrun_lease_takeovers_total", workspace=ws) == 0
    assert figures.value("agentrun_fenced_total", workspace=ws) == 0
    commits = figures.value("agentrun_commit_seconds_count", outcome="ok")
    assert commits >= 5 * 3

    port = int((tmp_path / "executor-1.metrics-port").read_text())
    mine = await scrape(f"http://127.0.0.1:{port}")
    assert mine.value("agentrun_executor_commit_seconds_count", outcome="ok") == commits
    # The executor's connect ran its release's self-check first: three canary runs more.
    assert mine.value("agentrun_executor_assignments_total") == CANARY_RUNS + sum(
        r.lease_epoch for r in runs
    )
    assert mine.value("agentrun_executor_rate_limit_total", provider="chat", outcome="429") == 1
    assert mine.value("agentrun_executor_rate_limit_total", outcome="granted") >= 2
    assert mine.value("agentrun_executor_parks_total", reason="sleep") == SLEEPERS
    assert mine.value("agentrun_executor_parks_total", reason="rate") == 1
    assert mine.value("agentrun_executor_runs_held") == 0
    assert mine.value("agentrun_executor_runs_released_total", how="completed") == 5 + CANARY_RUNS
    assert mine.value("agentrun_executor_model_calls_total", outcome="ok") >= 5 * 2
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"http://127.0.0.1:{port}/metrics")).status_code == 401
    assert executor.alive


def _awaiting(runs: Iterable[run_pb2.Run]) -> list[run_pb2.Run]:
    return [r for r in runs if r.status == run_pb2.RUN_STATUS_WAITING and r.wait_reason == "human"]


async def test_a_killed_executor_shows_as_lease_takeovers_and_unknown_outcomes(
    db_url, control_plane, executor_factory, db
):
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN)
    api = await Api.connect(cp.address, db_url)
    try:
        await api.publish("poster", "poster", ["chat_post"])
        await api.publish("charger", "charger", ["create_charge"])
        posters = [await api.start("poster") for _ in range(3)]
        charger = await api.start("charger", "lin")
        # Dies right after the first chat post is committed as started (before it is sent).
        (doomed,) = executor_factory(
            cp, AGENTRUN_FAULTS="executor.tool.after_started_commit=kill@1"
        )
        await eventually(lambda: not doomed.alive, timeout=30, message="the kill never fired")
        executor_factory(cp)

        async def settled() -> list[run_pb2.Run]:
            runs = [await api.get(r) for r in posters]
            held = await api.get(charger)
            assert held.status == run_pb2.RUN_STATUS_WAITING and held.wait_reason == "approval"
            assert all(
                r.status == run_pb2.RUN_STATUS_COMPLETED or r in _awaiting(runs) for r in runs
            )
            return [*runs, held]

        runs = await eventually(settled, timeout=40, message="the runs never settled")

        async def figures_agree() -> Scrape:
            figures = await scrape(cp.http_url)
            awaiting = _awaiting(runs)
            assert figures.value("agentrun_unknown_outcomes_awaiting", workspace=api.ws) == len(
                awaiting
            )
            assert figures.value(
                "agentrun_runs", workspace=api.ws, status="waiting", wait_reason="human"
            ) == len(awaiting)
            assert figures.value("agentrun_approvals_pending", workspace=api.ws) == 1
            backlog = await db.fetchval("SELECT count(*) FROM outbox WHERE delivered_at IS NULL")
            assert figures.value("agentrun_outbox_backlog") == backlog
            return figures

        figures = await eventually(figures_agree, timeout=10)
    finally:
        await api.close()
    assert doomed.returncode == -9
    # Each takeover bumped its run's attempt: the counter says the same, and it saw the kill.
    taken = sum(r.attempt for r in runs)
    assert taken >= 1
    assert figures.value("agentrun_lease_takeovers_total", workspace=api.ws) == taken
    assert _awaiting(runs), "the cut-off chat post should wait for a person"
    assert figures.value("agentrun_approvals_oldest_pending_seconds", workspace=api.ws) > 0
    assert figures.value("agentrun_scheduler_lag_seconds") == 0
