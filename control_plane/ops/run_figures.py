"""Finished runs, run and step durations, tokens and cost on /metrics, counted as runs end.

An after-commit effect (dispatch/pipeline.py; registered in control_plane/server.py), not a
branch in the commit path: once a commit landed it reads what to count off the commit
itself (the steps' usage priced with the credits' table, so the figures sum to the runs'
own counters exactly; the executor's `duration_ms` of each model and tool call) and, for a
run that ended or whose agent this replica has not seen yet, the run's row. That read runs
in a task of its own, so the executor's answer never waits for it. Runs that end without a
commit are counted where they end: a cancel (api/runs.py) and the max-age sweep
(dispatch/max_age.py).

Every replica counts what it committed; Prometheus sums them. A duplicate (a commit resent
after it landed) was counted when it first landed and is not counted again. Agent and model
names are chosen by workspaces and providers, so their label values are bounded per replica
(MAX_AGENTS workspace-agent pairs, MAX_MODELS models): the rest are counted as "_other".
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from control_plane.credits import pricing
from control_plane.ops import metrics
from control_plane.store import metrics as figures_store
from control_plane.store.db import Pool
from control_plane.store.runs import Run
from control_plane.store.steps import CommitRequest, CommitResult, NewStep
from telemetry.scrape import labelled

log = logging.getLogger(__name__)

TERMINAL = frozenset({"completed", "failed", "cancelled"})
MAX_AGENTS = 500
MAX_MODELS = 200
OTHER = "_other"
# Steps whose payload carries the executor's timing of the call they record.
TIMED = frozenset({"model_decision", "summary", "tool_result"})
_COUNTED = TIMED | pricing.PRICED_KINDS
# Runs whose agent this replica remembers (held runs commit many times).
_AGENTS_KEPT = 10_000


class Bounded:
    """Label values as given until `limit` distinct keys were seen, then OTHER for new ones."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[tuple[str, ...]] = set()

    def __call__(self, *key: str) -> str:
        if key in self._seen:
            return key[-1]
        if len(self._seen) >= self._limit:
            return OTHER
        self._seen.add(key)
        return key[-1]


class RunFigures:
    """The after-commit effect that counts, and the counts of runs that end elsewhere."""

    def __init__(self) -> None:
        self.agents = Bounded(MAX_AGENTS)
        self.models = Bounded(MAX_MODELS)
        self._agent_of: OrderedDict[tuple[str, uuid.UUID], str] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- AfterCommit (dispatch/pipeline.py) ------------------------------------

    def due(self, req: CommitRequest, result: CommitResult) -> bool:
        if result.duplicate:
            return False
        return result.status in TERMINAL or any(s.kind in _COUNTED for s in req.steps)

    async def settle(self, db: Pool, req: CommitRequest, result: CommitResult) -> CommitResult:
        # A callback, not a task: most commits need no read (their run's agent is known), and
        # a task per commit cost the control plane more than their counting (py-spy during
        # `python -m bench commit`); the answer still goes out first.
        asyncio.get_running_loop().call_soon(self._count, db, req, result.status in TERMINAL)
        return result

    # -- runs that end without a commit ---------------------------------------

    def cancelled(self, run: Run) -> None:
        """A run a caller cancelled (its row as the cancel returned it)."""
        seconds = None
        if run.finished_at is not None:
            seconds = (run.finished_at - run.created_at).total_seconds()
        self._finished(run.workspace_id, run.agent_id, run.status, seconds)

    def finished(self, db: Pool, workspace_id: str, run_id: uuid.UUID) -> None:
        """A run that ended by a statement of ours (the max-age sweep): read, then counted."""
        self._spawn(self._read_finished(db, workspace_id, run_id))

    # -- counting --------------------------------------------------------------

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _count(self, db: Pool, req: CommitRequest, finished: bool) -> None:
        """Count a landed commit: at once when its run's agent is known and it did not end
        the run, else after reading the run's row in a task of its own."""
        try:
            parsed = list(_parsed(req.steps))
            for kind, payload in parsed:
                _observe_duration(kind, payload)
            key = (req.workspace_id, req.run_id)
            agent = self._agent_of.get(key)
            if finished or (agent is None and any(k in pricing.PRICED_KINDS for k, _ in parsed)):
                self._spawn(self._count_read(db, req, parsed, finished))
            elif agent is not None:
                self._usage(req.workspace_id, agent, parsed)
                self._remember(key, agent)
        except Exception as exc:  # noqa: BLE001 - figures never fail a commit
            log.warning("metrics: could not count a commit of run %s: %s", req.run_id, exc)

    async def _count_read(
        self,
        db: Pool,
        req: CommitRequest,
        parsed: list[tuple[str, Mapping[str, Any]]],
        finished: bool,
    ) -> None:
        try:
            key = (req.workspace_id, req.run_id)
            row = await figures_store.run_figures(db, req.workspace_id, req.run_id)
            agent = row.agent if row is not None else ""
            if finished and row is not None:
                self._finished(req.workspace_id, row.agent, row.status, row.seconds)
            self._usage(req.workspace_id, agent, parsed)
            if finished:
                self._agent_of.pop(key, None)
            else:
                self._remember(key, agent)
        except Exception as exc:  # noqa: BLE001 - figures never fail a commit
            log.warning("metrics: could not count a commit of run %s: %s", req.run_id, exc)

    async def _read_finished(self, db: Pool, workspace_id: str, run_id: uuid.UUID) -> None:
        try:
            row = await figures_store.run_figures(db, workspace_id, run_id)
        except Exception as exc:  # noqa: BLE001 - figures never fail a sweep
            log.warning("metrics: could not read finished run %s: %s", run_id, exc)
            return
        if row is not None:
            self._finished(workspace_id, row.agent, row.status, row.seconds)

    def _remember(self, key: tuple[str, uuid.UUID], agent: str) -> None:
        self._agent_of[key] = agent
        self._agent_of.move_to_end(key)
        while len(self._agent_of) > _AGENTS_KEPT:
            self._agent_of.popitem(last=False)

    def _finished(self, ws: str, agent: str, status: str, seconds: float | None) -> None:
        if status not in TERMINAL:
            return
        labelled(metrics.RUNS_FINISHED, ws, self.agents(ws, agent), status).inc()
        if seconds is not None:
            labelled(metrics.RUN_SECONDS, ws, status).observe(max(seconds, 0.0))

    def _usage(self, ws: str, agent: str, parsed: list[tuple[str, Mapping[str, Any]]]) -> None:
        """Tokens and cost of the priced steps, by the table the commit was charged by."""
        agent = self.agents(ws, agent)
        table = pricing.table()
        for i, (kind, payload) in enumerate(parsed):
            if kind not in pricing.PRICED_KINDS:
                continue
            usage = pricing.step_usage(table, kind, payload, f"steps[{i}]")
            if kind == "tool_started":
                labelled(metrics.TOOL_COST, ws, agent).inc(usage.cost_micros)
                continue
            model = self.models(str(payload.get("model") or ""))
            labelled(metrics.TOKENS, ws, agent, model, "input").inc(usage.input_tokens)
            labelled(metrics.TOKENS, ws, agent, model, "output").inc(usage.output_tokens)
            labelled(metrics.MODEL_COST, ws, agent, model).inc(usage.cost_micros)


def _parsed(steps: Iterable[NewStep]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """The counted steps' kinds and payloads (the commit was checked: they are JSON)."""
    for step in steps:
        if step.kind in _COUNTED:
            payload = json.loads(step.payload_json)
            if isinstance(payload, Mapping):
                yield step.kind, payload


def _observe_duration(kind: str, payload: Mapping[str, Any]) -> None:
    """The executor's timing of the call a step records (older executors send none)."""
    ms = payload.get("duration_ms") if kind in TIMED else None
    if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
        labelled(metrics.STEP_SECONDS, kind).observe(ms / 1000)


# The replica's one instance: the pipeline's effect and the cancel and sweep paths share it.
FIGURES = RunFigures()
