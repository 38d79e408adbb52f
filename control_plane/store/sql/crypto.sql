-- name: data_key_current :one
-- A workspace's data key for new seals: its newest unretired version (wrapped).
SELECT workspace_id, version, kms_key_version, wrapped FROM workspace_data_keys
WHERE workspace_id = $1 AND retired_at IS NULL
ORDER BY version DESC
LIMIT 1;

-- name: data_key_get :one
-- One version of a workspace's data key (wrapped), retired or not.
SELECT workspace_id, version, kms_key_version, wrapped FROM workspace_data_keys
WHERE workspace_id = $1 AND version = $2;

-- name: data_key_insert_first :exec
-- A workspace's first data key, unless another replica made one first.
INSERT INTO workspace_data_keys (workspace_id, version, kms_key_version, wrapped)
VALUES ($1, 1, $2, $3)
ON CONFLICT DO NOTHING;

-- name: data_key_rotation_lock :one
-- Serialise data key rotations of one workspace until the caller's transaction ends (an
-- advisory lock: the workspace row stays free for the claim path); nothing if no workspace.
SELECT pg_advisory_xact_lock(hashtextextended('workspace_data_keys:' || $1, 0)) IS NULL AS locked
FROM workspaces WHERE workspace_id = $1;

-- name: data_key_next_version :one
-- The version a workspace's next data key takes (run after the rotation lock: its snapshot
-- then sees every rotation committed before).
SELECT coalesce(max(version), 0) + 1 AS next_version
FROM workspace_data_keys WHERE workspace_id = $1;

-- name: data_key_insert :exec
-- A new data key version for new seals.
INSERT INTO workspace_data_keys (workspace_id, version, kms_key_version, wrapped)
VALUES ($1, $2, $3, $4);

-- name: data_key_retire_older :exec
-- Older versions stop sealing (they keep opening). Database clock unless $3.
-- The clock as a subquery: Citus refuses now() inside coalesce in a write.
UPDATE workspace_data_keys SET retired_at = (SELECT coalesce($3::timestamptz, now()))
WHERE workspace_id = $1 AND version < $2 AND retired_at IS NULL;

-- name: data_key_not_under :many
-- Up to $2 data keys wrapped under a KMS key version other than $1 (what re-wrapping has left).
SELECT workspace_id, version, kms_key_version, wrapped FROM workspace_data_keys
WHERE kms_key_version <> $1
ORDER BY workspace_id, version
LIMIT $2;

-- name: data_key_rewrap :exec
-- Replace a data key's wrapping, guarded by the wrapping it replaces.
UPDATE workspace_data_keys SET kms_key_version = $4, wrapped = $5
WHERE workspace_id = $1 AND version = $2 AND kms_key_version = $3;

-- name: data_key_summary :many
-- Per KMS key version: how many data keys it wraps (what `agentrun keys status` shows).
SELECT kms_key_version, count(*) AS data_keys, count(DISTINCT workspace_id) AS workspaces
FROM workspace_data_keys
GROUP BY kms_key_version
ORDER BY kms_key_version;
