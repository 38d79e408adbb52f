"""Every named statement, planned by a Citus coordinator: which it refuses, which span shards.

On a fresh database of the cluster that AGENTRUN_TEST_CITUS_URL names, migrated and
distributed as `agentrun migrate --citus` does it (control_plane/store/citus.py), each
statement of control_plane/store/sql/ is EXPLAINed with sample values (workspace ids on two
different workers wherever it takes several), then run once on the empty tables, each in a
transaction rolled back. A statement is *refused* when Citus raises at either step, and
*multi-shard* when a distributed scan of its plan has more than one task.

citus_statements.txt lists both, and the test keeps the list exactly true: a statement that
starts being refused or spanning shards fails it, and so does one that stops (take it off
the list). The list only shrinks. The hot statements (claim, commit, heartbeat, admission,
approval decision) are named in tests/harness/citus.py and reported on every run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from control_plane.store import citus, lease, steps
from tests.harness.citus import HOT, SKIP_REASON, Verdict, citus_url, drop_database, fresh_database
from tests.harness.citus import probe as probe_statements

EXPECTED = Path(__file__).with_name("citus_statements.txt")

pytestmark = pytest.mark.skipif(citus_url() is None, reason=SKIP_REASON)


def expected() -> dict[str, str]:
    """name -> 'refused' or 'multi-shard', from citus_statements.txt."""
    found = {}
    for line in EXPECTED.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            kind, name = words
            assert kind in ("refused", "multi-shard"), line
            found[name] = kind
    return found


def observed(verdicts: dict[str, Verdict]) -> dict[str, str]:
    found = {}
    for name, verdict in verdicts.items():
        if verdict.refused:
            found[name] = "refused"
        elif verdict.multi_shard:
            found[name] = "multi-shard"
    return found


def render(verdicts: dict[str, Verdict]) -> str:
    """citus_statements.txt as it should read for these verdicts."""
    lines = []
    for name, verdict in sorted(verdicts.items(), key=lambda kv: (not kv[1].refused, kv[0])):
        hot = f" [hot: {HOT[name]}]" if name in HOT else ""
        if verdict.refused:
            lines.append(f"refused {name}  # {verdict.refused[:150]}{hot}")
        elif verdict.multi_shard:
            lines.append(f"multi-shard {name}  # {verdict.tasks} tasks{hot}")
    return "\n".join(lines) + "\n"


def report(verdicts: dict[str, Verdict]) -> str:
    refused = [v for v in verdicts.values() if v.refused]
    multi = [v for v in verdicts.values() if not v.refused and v.multi_shard]
    lines = [
        f"{len(verdicts)} named statements: {len(refused)} refused, {len(multi)} multi-shard "
        f"({sum(v.tasks > 2 for v in multi)} on every shard)"
    ]
    for name, what in HOT.items():
        verdict = verdicts[name]
        state = (
            f"REFUSED ({verdict.refused})"
            if verdict.refused
            else ("one shard" if verdict.tasks <= 1 else f"{verdict.tasks} shards")
        )
        lines.append(f"  hot {what:17} {name:24} {state}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
async def citus_db() -> AsyncIterator[str]:
    url = citus_url()
    assert url is not None
    fresh = await fresh_database(url, "statements")
    try:
        await citus.migrate_and_distribute(fresh)
        yield fresh
    finally:
        await drop_database(fresh)


@pytest.fixture(scope="module")
async def verdicts(citus_db: str) -> dict[str, Verdict]:
    conn = await asyncpg.connect(citus_db)
    try:
        return await probe_statements(conn)
    finally:
        await conn.close()


def test_the_list_of_refused_and_multi_shard_statements_is_exactly_true(
    verdicts: dict[str, Verdict],
) -> None:
    print("\n" + report(verdicts))
    want, got = expected(), observed(verdicts)
    new = {n: k for n, k in got.items() if want.get(n) != k}
    gone = {n: k for n, k in want.items() if got.get(n) != k}
    assert not new and not gone, (
        f"{report(verdicts)}\nnewly refused or spanning shards: {new}\n"
        f"no longer so (take them off {EXPECTED.name}): {gone}\n"
        f"the list as it now stands:\n{render(verdicts)}"
    )


def test_every_hot_statement_is_named_and_known(verdicts: dict[str, Verdict]) -> None:
    assert set(HOT) <= set(verdicts)


def commit_of(
    key: lease.LeaseKey, seq: int, payload: str, renew_always: bool = True
) -> steps.CommitRequest:
    new = [steps.NewStep(seq, "model_decision", None, payload)]
    return steps.CommitRequest(
        key.workspace_id, key.run_id, key.epoch, new, renew_always=renew_always
    )


async def test_the_commit_and_the_lease_statements_run_on_rows_they_match(
    citus_db: str, verdicts: dict[str, Verdict]
) -> None:
    """The probe takes a data error for the sample values' fault, so a statement Citus plans
    but cannot run (one that fails reading back its intermediate results, "PGCOPY") passes
    it. The commit and lease statements run here on the seeded running runs, one workspace
    on each worker, through the store as the control plane calls them."""
    assert verdicts  # the probe seeded the runs: running, held by their workspace's name
    pool = await asyncpg.create_pool(citus_db, min_size=1, max_size=2)
    try:
        held = await pool.fetch(
            "SELECT workspace_id, run_id, lease_epoch FROM runs WHERE status = 'running'"
            " ORDER BY workspace_id"
        )
        assert len({r["workspace_id"] for r in held}) == 2
        payload = json.dumps({"content": "x", "tool_calls": []})
        for row in held:
            key = lease.LeaseKey(row["workspace_id"], row["run_id"], row["lease_epoch"])
            owner = key.workspace_id
            assert set((await lease.heartbeat(pool, owner, [key], 30)).renewed) == {key}

            kept = await steps.commit(pool, commit_of(key, 1, payload, renew_always=False), 30)
            renewed = await steps.commit(pool, commit_of(key, 2, payload), 30)
            assert (kept.status, kept.renewed, renewed.renewed) == ("running", False, True)
            # The grouped statement itself (commit_many would fall back to single commits).
            grouped = await steps._apply_many(pool, [commit_of(key, 3, payload)], 30)
            assert [(r["i"], r["status"], r["renewed"]) for r in grouped] == [(1, "running", True)]
            assert await lease.release_on_break(pool, owner, [key], 2) == [key]
            await pool.execute(
                "UPDATE runs SET active_seconds = 1e9 WHERE workspace_id = $1 AND run_id = $2",
                key.workspace_id,
                key.run_id,
            )
            assert (await lease.heartbeat(pool, owner, [key], 30)).past_deadline == {key}
            done = await pool.fetchrow(
                "SELECT status, step_count FROM runs WHERE workspace_id = $1 AND run_id = $2",
                key.workspace_id,
                key.run_id,
            )
            assert (done["status"], done["step_count"]) == ("failed", 5)
    finally:
        await pool.close()
