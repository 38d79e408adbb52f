"""The control plane's Prometheus metrics, served at `/metrics` on the HTTP ingress.

Two kinds of figures:

* **Events**, counted where they happen (counters and histograms in this module's
  registry, labelled by workspace where the event has one): claims and their latency,
  lease takeovers, commits and their latency, fenced commits and heartbeats, parks by
  reason, scheduler lag when a slot fires. Summed across replicas by Prometheus.
* **State**, counted by a query when scraped (`store/metrics.py`), cached for
  `CACHE_SECONDS` so a scrape storm costs one query: unfinished runs by workspace,
  status and wait reason, unknown outcomes awaiting a person, pending approvals and the
  oldest one's age, the outbox backlog, the most overdue schedule. Every replica
  reports the same database figures (query them with `max by`, not `sum`).

The labels name workspaces and their load, so `/metrics` is not public: it needs
`authorization: Bearer <token>` with `AGENTRUN_METRICS_TOKEN` (a scrape-only secret,
compared in constant time), or a platform key (`agr_pa_…`). Nothing else may scrape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control_plane.store import metrics as figures_store
from control_plane.store.db import Pool
from telemetry.scrape import LATENCY_BUCKETS, labelled, token_matches

log = logging.getLogger(__name__)

CACHE_SECONDS = 2.0
QUERY_TIMEOUT = 5.0

REGISTRY = CollectorRegistry()

CLAIM_SECONDS = Histogram(
    "agentrun_claim_seconds",
    "Duration of one fair claim transaction (a batch of runs)",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
CLAIMED = Counter(
    "agentrun_claimed_runs",
    "Runs leased to an executor by a claim (rate() = claims per second)",
    ["workspace"],
    registry=REGISTRY,
)
TAKEOVERS = Counter(
    "agentrun_lease_takeovers",
    "Runs claimed after their lease lapsed: a dead, paused or partitioned executor's",
    ["workspace"],
    registry=REGISTRY,
)
COMMIT_SECONDS = Histogram(
    "agentrun_commit_seconds",
    "Duration of committing one executor Commit, by outcome",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
FENCED = Counter(
    "agentrun_fenced",
    "Writes refused because the executor no longer holds the lease (via commit or heartbeat)",
    ["workspace", "via"],
    registry=REGISTRY,
)
PARKS = Counter(
    "agentrun_parks",
    "Runs parked by a commit, by wait reason",
    ["workspace", "reason"],
    registry=REGISTRY,
)
REFUSED_CALLS = Counter(
    "agentrun_refused_calls",
    "Tool calls a constraint refused before they started, by rule (issue 48)",
    ["workspace", "rule"],
    registry=REGISTRY,
)
REFUSED_RUNS = Counter(
    "agentrun_refused_runs",
    "Runs that ended failed because a constraint refused a call (on_refusal: fail)",
    ["workspace"],
    registry=REGISTRY,
)
# Issue 48, refusals are visible outcomes: every run that finishes after a constraint
# refused some of its calls, by its outcome (completed_with_refusals, only_refused: completed
# but none of its calls ran, failed), whatever its agent's on_refusal; counted by the commit
# that finishes the run.
RUNS_FINISHED_WITH_REFUSALS = Counter(
    "agentrun_runs_finished_with_refusals",
    "Runs that finished after a constraint refused some of their calls, by outcome",
    ["workspace", "outcome"],
    registry=REGISTRY,
)
APPROVERS_FLAGGED = Counter(
    "agentrun_approvers_flagged",
    "Approvers flagged to their admins for approving too fast (the workspace's watch)",
    ["workspace"],
    registry=REGISTRY,
)
SCHEDULE_LAG = Histogram(
    "agentrun_schedule_fire_lag_seconds",
    "How late a schedule slot fired, after its fire time (database clock)",
    buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
    registry=REGISTRY,
)


# -- Runs, steps, tokens and cost (issue 46): counted by control_plane/ops/run_figures.py as
# commits land (an after-commit effect) and where runs are cancelled or swept. Each replica
# counts what it committed; Prometheus sums them (`sum by`). Agent and model label values
# are bounded per replica (run_figures.MAX_AGENTS, MAX_MODELS; the rest are "_other").
RUN_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)
STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RUNS_FINISHED = Counter(
    "agentrun_runs_finished",
    "Runs that ended, by status (completed, failed, cancelled) and agent",
    ["workspace", "agent", "status"],
    registry=REGISTRY,
)
RUN_SECONDS = Histogram(
    "agentrun_run_duration_seconds",
    "Finished runs' time from admission to finish (database clock), waits included",
    ["workspace", "status"],
    buckets=RUN_BUCKETS,
    registry=REGISTRY,
)
STEP_SECONDS = Histogram(
    "agentrun_step_duration_seconds",
    "Model calls (model_decision, summary) and tool calls (tool_result), as the executor timed them",
    ["kind"],
    buckets=STEP_BUCKETS,
    registry=REGISTRY,
)
TOKENS = Counter(
    "agentrun_tokens",
    "Model tokens as the providers reported them, by type (input, output), agent and model",
    ["workspace", "agent", "model", "type"],
    registry=REGISTRY,
)
MODEL_COST = Counter(
    "agentrun_model_cost_micros",
    "What model calls cost, in micro-credits (1 credit = 1,000,000), by agent and model",
    ["workspace", "agent", "model"],
    registry=REGISTRY,
)
TOOL_COST = Counter(
    "agentrun_tool_cost_micros",
    "What tool calls cost, in micro-credits, by agent (a run's cost = model + tool)",
    ["workspace", "agent"],
    registry=REGISTRY,
)
# -- end of issue 46's block.


def commit_outcome(name: str, seconds: float) -> None:
    labelled(COMMIT_SECONDS, name).observe(seconds)


def claimed(workspace_id: str) -> None:
    """A run leased by a claim, counted for its workspace."""
    labelled(CLAIMED, workspace_id).inc()


class DatabaseFigures(Collector):
    """Scrape-time gauges from the database, cached; `refresh()` before collecting."""

    def __init__(self, pool: Pool, ttl: float = CACHE_SECONDS) -> None:
        self._pool = pool
        self._ttl = ttl
        self._figures: figures_store.Figures | None = None
        self._read_at = float("-inf")
        self._ok = False
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:
            if time.monotonic() - self._read_at < self._ttl:
                return
            try:
                self._figures = await asyncio.wait_for(
                    figures_store.figures(self._pool), QUERY_TIMEOUT
                )
                self._ok = True
            except Exception as exc:  # noqa: BLE001 - a scrape must answer while Postgres is down
                log.warning("metrics: the database figures could not be read: %s", exc)
                self._figures, self._ok = None, False
            self._read_at = time.monotonic()

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("agentrun_database_up", "Whether the last figures query succeeded")
        up.add_metric([], 1.0 if self._ok else 0.0)
        yield up
        if self._figures is not None:
            yield from _gauges(self._figures)


def _gauges(f: figures_store.Figures) -> Iterator[Metric]:
    runs = GaugeMetricFamily(
        "agentrun_runs",
        "Unfinished runs by workspace, status and wait reason",
        labels=["workspace", "status", "wait_reason"],
    )
    for (ws, status, reason), count in sorted(f.runs.items()):
        runs.add_metric([ws, status, reason], count)
    yield runs
    unknowns = GaugeMetricFamily(
        "agentrun_unknown_outcomes_awaiting",
        "Runs waiting for a person to settle an unknown outcome or a held repeat",
        labels=["workspace"],
    )
    for ws, count in sorted(f.unknowns_awaiting.items()):
        unknowns.add_metric([ws], count)
    yield unknowns
    yield from _approvals(f)
    yield GaugeMetricFamily(
        "agentrun_outbox_backlog", "Notifications not delivered yet", value=f.outbox_backlog
    )
    yield GaugeMetricFamily(
        "agentrun_outbox_oldest_seconds",
        "Age of the oldest undelivered notification",
        value=f.outbox_oldest_seconds,
    )
    yield GaugeMetricFamily(
        "agentrun_scheduler_lag_seconds",
        "Lateness of the most overdue enabled schedule (0: every due slot fired)",
        value=f.scheduler_lag_seconds,
    )


def _approvals(f: figures_store.Figures) -> Iterator[Metric]:
    pending = GaugeMetricFamily(
        "agentrun_approvals_pending", "Undecided approvals", labels=["workspace"]
    )
    oldest = GaugeMetricFamily(
        "agentrun_approvals_oldest_pending_seconds",
        "Age of the oldest undecided approval",
        labels=["workspace"],
    )
    for ws, (count, age) in sorted(f.approvals_pending.items()):
        pending.add_metric([ws], count)
        oldest.add_metric([ws], age)
    yield pending
    yield oldest


class Exposition:
    """Renders this module's registry and a replica's database figures."""

    def __init__(self, pool: Pool, ttl: float = CACHE_SECONDS) -> None:
        self.figures = DatabaseFigures(pool, ttl)
        self._scrape = CollectorRegistry(auto_describe=False)
        self._scrape.register(self.figures)

    async def render(self) -> bytes:
        await self.figures.refresh()
        return generate_latest(REGISTRY) + generate_latest(self._scrape)


__all__ = ["CONTENT_TYPE_LATEST", "REGISTRY", "Exposition", "token_matches"]
