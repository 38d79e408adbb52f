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
