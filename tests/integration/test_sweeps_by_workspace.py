"""Sweepers take their due rows workspace by workspace (each locking read names one
workspace, so on Citus it is one shard): the batch still holds, the longest waiting
workspace goes first, and every due row is taken exactly once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.store import agents, outbox

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _queue(pool, db, workspace_id: str, due: datetime, n: int) -> None:
    await agents.ensure_workspace(pool, workspace_id)
    for _ in range(n):
        note = outbox.Notification(workspace_id, "approval_request", "mail", "a@b.c", {})
        await outbox.insert(pool, note)
    await db.execute(
        "UPDATE outbox SET next_attempt_at = $2 WHERE workspace_id = $1", workspace_id, due
    )


async def test_the_outbox_is_claimed_workspace_by_workspace_within_the_batch(pool, db):
    await _queue(pool, db, "late", T0 + timedelta(seconds=3), 2)
    await _queue(pool, db, "early", T0 + timedelta(seconds=1), 2)
    await _queue(pool, db, "middle", T0 + timedelta(seconds=2), 2)
    await _queue(pool, db, "future", T0 + timedelta(hours=1), 2)
    now = T0 + timedelta(seconds=10)
    first = await outbox.claim(pool, 3, 30.0, now)
    assert [r["workspace_id"] for r in first] == ["early", "early", "middle"]
    rest = await outbox.claim(pool, 10, 30.0, now)
    assert sorted(r["workspace_id"] for r in rest) == ["late", "late", "middle"]
    assert await outbox.claim(pool, 10, 30.0, now) == []  # the claimed ones wait 30 s
    taken = [r["notification_id"] for r in first + rest]
    assert len(set(taken)) == 6
