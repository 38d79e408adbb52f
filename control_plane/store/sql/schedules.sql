-- name: schedule_active_runs :many
-- The runs schedule $2 (of agent $3) started that are still going, oldest first: what its
-- overlap policy looks at. Read through the agent's non-terminal runs, so the cost follows
-- how many are going, not how many the schedule ever started.
SELECT r.run_id, r.status FROM runs r
JOIN trigger_events e ON e.workspace_id = r.workspace_id AND e.run_id = r.run_id
WHERE r.workspace_id = $1 AND r.agent_id = $3 AND e.trigger_id = $2
  AND r.status IN ('queued', 'running', 'waiting')
ORDER BY r.created_at, r.run_id;

-- name: schedule_lock :one
-- A schedule, locked until the caller's transaction ends (backfill, trigger now, update and
-- pause wait for a scheduler round holding it, and it skips them meanwhile), with the
-- database's time unless $3.
SELECT t.*, coalesce($3::timestamptz, now()) AS db_now FROM triggers t
WHERE t.workspace_id = $1 AND t.trigger_id = $2 AND t.kind = 'schedule'
FOR UPDATE;

-- name: schedule_buffer :exec
-- Buffer one slot ($3, its event's dedupe key $4) under buffer_one; a buffer holds one.
UPDATE triggers SET buffered_slot_at = $3, buffered_dedupe_key = $4, updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2 AND buffered_slot_at IS NULL;

-- name: schedule_unbuffer :exec
-- The buffered slot was fired: empty the buffer.
UPDATE triggers SET buffered_slot_at = NULL, buffered_dedupe_key = NULL, updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2;

-- name: schedule_buffered_workspaces :many
-- Up to $1 workspaces with an enabled schedule holding a buffered slot and no run of it
-- still going, the longest buffered first. No lock: on Citus this reads every shard,
-- which a locking read may not.
SELECT t.workspace_id FROM triggers t
WHERE t.buffered_slot_at IS NOT NULL AND t.enabled AND t.kind = 'schedule'
  AND NOT EXISTS (
      SELECT 1 FROM runs r
      JOIN trigger_events e ON e.workspace_id = r.workspace_id AND e.run_id = r.run_id
      WHERE r.workspace_id = t.workspace_id AND r.agent_id = t.agent_id
        AND e.trigger_id = t.trigger_id AND r.status IN ('queued', 'running', 'waiting'))
GROUP BY t.workspace_id
ORDER BY min(t.buffered_slot_at)
LIMIT $1;

-- name: schedule_claim_buffered :many
-- Lock up to $2 of workspace $3's enabled schedules with a buffered slot and no run still
-- going, skipping those another replica holds: their buffered slot fires now (one
-- workspace: one shard on Citus). Database clock unless $1.
SELECT t.*, coalesce($1::timestamptz, now()) AS db_now FROM triggers t
WHERE t.workspace_id = $3
  AND t.buffered_slot_at IS NOT NULL AND t.enabled AND t.kind = 'schedule'
  AND NOT EXISTS (
      SELECT 1 FROM runs r
      JOIN trigger_events e ON e.workspace_id = r.workspace_id AND e.run_id = r.run_id
      WHERE r.workspace_id = $3 AND e.workspace_id = $3 AND r.agent_id = t.agent_id
        AND e.trigger_id = t.trigger_id AND r.status IN ('queued', 'running', 'waiting'))
ORDER BY t.buffered_slot_at
LIMIT $2
FOR UPDATE OF t SKIP LOCKED;

-- name: schedule_update :one
-- Replace a schedule's config and move it to the new spec's next slot ($4, firing at $5);
-- enabled, note and the buffer stay.
UPDATE triggers SET config = $3::jsonb, next_slot_at = $4, next_fire_at = $5, updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2 AND kind = 'schedule'
RETURNING *;

-- name: trigger_pause :one
-- Pause ($3 false) or unpause a trigger, with a note; an unpaused schedule moves to its next
-- slot after now ($5, firing at $6), so the slots it missed while paused never fire.
UPDATE triggers SET enabled = $3, note = $4,
    next_slot_at = coalesce($5::timestamptz, next_slot_at),
    next_fire_at = coalesce($6::timestamptz, next_fire_at), updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2
RETURNING *;

-- name: trigger_delete :one
-- Delete a trigger with its secrets and its event records (the runs it started stay), in one
-- statement; nothing when there is no such trigger.
WITH secrets AS (
    DELETE FROM trigger_secrets WHERE workspace_id = $1 AND trigger_id = $2
), events AS (
    DELETE FROM trigger_events WHERE workspace_id = $1 AND trigger_id = $2
)
DELETE FROM triggers WHERE workspace_id = $1 AND trigger_id = $2
RETURNING trigger_id, kind;
