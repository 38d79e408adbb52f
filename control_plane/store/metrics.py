"""Reads behind /metrics and /readyz: counts taken at scrape time, and a ping."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from control_plane.store.db import Pool, transaction
from control_plane.store.queries import run


@dataclass(frozen=True)
class Figures:
    """What the database says at one scrape."""

    # (workspace, status, wait reason or "") -> unfinished runs
    runs: dict[tuple[str, str, str], int]
    unknowns_awaiting: dict[str, int]
    # workspace -> (pending approvals, age of the oldest in seconds)
    approvals_pending: dict[str, tuple[int, float]]
    outbox_backlog: int
    outbox_oldest_seconds: float
    schedules_due: int
    scheduler_lag_seconds: float


async def figures(pool: Pool) -> Figures:
    """Every count, read on one connection."""
    async with transaction(pool) as conn:
        runs = await run(conn, "metrics_runs_by_state")
        unknowns = await run(conn, "metrics_unknowns_awaiting")
        approvals = await run(conn, "metrics_approvals_pending")
        outbox = await run(conn, "metrics_outbox_backlog")
        schedules = await run(conn, "metrics_schedules_overdue")
    return Figures(
        runs={(r["workspace_id"], r["status"], r["wait_reason"]): r["runs"] for r in runs},
        unknowns_awaiting={r["workspace_id"]: r["runs"] for r in unknowns},
        approvals_pending={
            r["workspace_id"]: (r["pending"], r["oldest_seconds"]) for r in approvals
        },
        outbox_backlog=outbox["backlog"],
        outbox_oldest_seconds=outbox["oldest_seconds"],
        schedules_due=schedules["due"],
        scheduler_lag_seconds=schedules["lag_seconds"],
    )


async def ping(pool: Pool) -> bool:
    """True when the database answers `SELECT 1` (the caller bounds the wait)."""
    row = await run(pool, "health_ping")
    return row is not None and row["ok"] == 1


@dataclass(frozen=True)
class RunFigures:
    """One run as /metrics counts it: its agent, status and (finished) duration."""

    agent: str
    status: str
    seconds: float | None  # admission to finish, database clock; None while unfinished


async def run_figures(pool: Pool, workspace_id: str, run_id: uuid.UUID) -> RunFigures | None:
    """The figures of one run (None: it no longer exists, e.g. deleted by retention)."""
    row = await run(pool, "run_figures_of", workspace_id, run_id)
    if row is None:
        return None
    return RunFigures(row["agent_id"], row["status"], row["seconds"])
