-- name: channel_insert :one
-- Add a workspace channel (its secret already sealed for this row); a used name adds nothing.
INSERT INTO channels (workspace_id, channel_id, kind, name, config, secret_sealed)
VALUES ($1, $2, $3, $4, $5::jsonb, $6)
ON CONFLICT (workspace_id, name) DO NOTHING
RETURNING *;

-- name: channel_list :many
-- A workspace's channels, by name.
SELECT * FROM channels WHERE workspace_id = $1 ORDER BY name;

-- name: channel_get :one
-- One channel of a workspace, by id.
SELECT * FROM channels WHERE workspace_id = $1 AND channel_id = $2;

-- name: channel_of_kind :one
-- The workspace's channel of a kind that delivers its mail or chat rows (the oldest).
SELECT * FROM channels WHERE workspace_id = $1 AND kind = $2 ORDER BY created_at, name LIMIT 1;

-- name: channel_delete :one
-- Remove a channel by name.
DELETE FROM channels WHERE workspace_id = $1 AND name = $2 RETURNING channel_id;

-- name: lifecycle_channels :many
-- Up to $1 webhook channels subscribed to run lifecycle events, in any workspace. No lock
-- (on Citus it reads every shard).
SELECT workspace_id, channel_id, config, lifecycle_cursor, created_at FROM channels
WHERE kind = 'webhook' AND jsonb_array_length(coalesce(config -> 'events', '[]')) > 0
ORDER BY workspace_id, channel_id
LIMIT $1;

-- name: lifecycle_enqueue :one
-- Queue one webhook notification per run of workspace $1 that finished (status in $3, of
-- agent $4 unless NULL) since a window ($5 seconds) behind channel $2's cursor (or since
-- the channel was added), and move the cursor. Each run's row id is derived from the
-- channel and the run, so reading the window again queues nothing twice (a finish that
-- commits late, inside the window, is still found).
WITH chan AS (
    SELECT channel_id, coalesce(lifecycle_cursor, created_at) AS since FROM channels
    WHERE workspace_id = $1 AND channel_id = $2
), finished AS (
    SELECT r.run_id, r.agent_id, r.status, r.error, r.finished_at FROM runs r, chan c
    WHERE r.workspace_id = $1 AND r.finished_at IS NOT NULL
      AND r.finished_at > c.since - make_interval(secs => $5::float8)
      AND r.status = ANY($3::text[]) AND ($4::text IS NULL OR r.agent_id = $4)
    ORDER BY r.finished_at
    LIMIT 500
), queued AS (
    INSERT INTO outbox (workspace_id, notification_id, kind, channel, recipient, payload)
    SELECT $1, md5($2::text || ':' || f.run_id::text)::uuid, 'run_' || f.status, 'webhook',
           $2::text,
           jsonb_build_object('kind', 'run_' || f.status, 'run_id', f.run_id,
                              'agent_id', f.agent_id, 'status', f.status, 'error', f.error,
                              'finished_at', f.finished_at)
    FROM finished f
    ON CONFLICT (workspace_id, notification_id) DO NOTHING
    RETURNING 1
), moved AS (
    UPDATE channels SET lifecycle_cursor = (SELECT max(finished_at) FROM finished)
    WHERE workspace_id = $1 AND channel_id = $2 AND EXISTS (SELECT 1 FROM finished)
      AND (lifecycle_cursor IS NULL
           OR lifecycle_cursor < (SELECT max(finished_at) FROM finished))
)
SELECT count(*) AS queued FROM queued;
