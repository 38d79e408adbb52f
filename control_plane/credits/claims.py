"""Reservations at claim: a metered run reserves its chunk before an executor sees it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection

import faults
from control_plane.ops import run_figures
from control_plane.store import credits as store
from control_plane.store.db import Pool
from control_plane.store.runs import Run

log = logging.getLogger(__name__)


async def reserve_claimed(
    pool: Pool, claimed: list[Run], metered: Collection[str]
) -> set[uuid.UUID]:
    """Reserve for each claimed run of a metered workspace that owes a chunk (its first,
    or the next after a commit whose top-up a crash cut off). The runs that stopped here
    (out of credits: parked or failed, lease released) are returned: they are not assigned.

    `metered`: the claimed runs' workspaces that have a credit account, as the claim read
    them (lease.Claimed.metered). One statement per run that owes; a batch of unmetered
    workspaces' runs costs nothing."""
    stopped: set[uuid.UUID] = set()
    for run in claimed:
        if run.workspace_id not in metered or run.cost_micros < run.credits_reserved_micros:
            continue
        outcome = await store.reserve(
            pool, run.workspace_id, run.run_id, run.lease_epoch, may_stop=True
        )
        # Reserved, not yet assigned: a crash here leaves the lease to lapse, and the next
        # claim finds the chunk reserved (the run no longer owes).
        faults.point("control_plane.credits.after_claim_reserve")
        if outcome is not None and outcome.status != "running":
            log.info("run %s stopped at claim: %s", run.run_id, outcome.reason)
            stopped.add(run.run_id)
            if outcome.status == "failed":
                run_figures.FIGURES.finished(pool, run.workspace_id, run.run_id)
    return stopped
