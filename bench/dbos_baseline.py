"""DBOS Transact baseline: workflows of ten trivial steps, each step's output recorded in Postgres.

DBOS is a library, so the workflows run in this process against their own database on the
same Postgres server as agentrun's. Each step does as little as an agentrun step's own work
can (return a small dict); what is measured is DBOS recording it. The workflows are plain
functions started with DBOS.start_workflow (one DBOS executor thread each): on this kind of
machine that ran faster than async workflows, so DBOS is measured at its better.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dbos import DBOS

STEPS_PER_WORKFLOW = 10


@DBOS.step()
def recorded_step(i: int) -> dict[str, int]:
    return {"step": i}


@DBOS.workflow()
def ten_steps(n: int) -> int:
    for i in range(STEPS_PER_WORKFLOW):
        recorded_step(i)
    return n


RECORDED_STEPS = "SELECT count(*) FROM dbos.operation_outputs"


@dataclass(frozen=True)
class DbosResult:
    workflows: int
    seconds: float


def measure(dsn: str, workflows: int) -> DbosResult:
    """Launch DBOS on `dsn`, run `workflows` workflows concurrently, time them, shut down.

    Blocking (DBOS's sync API): call it in a worker thread. The recorded steps can then be
    counted with RECORDED_STEPS.
    """
    config = {"name": "agentrun-bench", "system_database_url": dsn, "log_level": "WARNING"}
    DBOS(config=config)  # type: ignore[arg-type]
    try:
        DBOS.launch()
        start = time.perf_counter()
        handles = [DBOS.start_workflow(ten_steps, i) for i in range(workflows)]
        for handle in handles:
            handle.get_result()
        elapsed = time.perf_counter() - start
    finally:
        DBOS.destroy()
    return DbosResult(workflows, elapsed)
