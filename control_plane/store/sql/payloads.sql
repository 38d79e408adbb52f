-- name: payload_lock :exec
-- Serialise uploads of one payload ($1 workspace, $2 sha256) in this transaction.
SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0));

-- name: payload_lease_held :one
-- Whether run $2 of workspace $1 is still running under lease epoch $3.
SELECT EXISTS (
    SELECT 1 FROM runs
    WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running'
) AS held;

-- name: payload_get :one
-- A whole payload's row, if it is stored.
SELECT size, media_type FROM payloads WHERE workspace_id = $1 AND sha256 = $2;

-- name: payload_received :one
-- How many bytes of payload $2 have arrived so far (contiguous from 0).
SELECT coalesce(sum(length(data)), 0)::bigint AS received
FROM payload_chunks WHERE workspace_id = $1 AND sha256 = $2;

-- name: payload_chunk_insert :exec
-- Append one chunk ($3 offset, $4 data) of payload $2.
INSERT INTO payload_chunks (workspace_id, sha256, "offset", data) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING;

-- name: payload_chunks_all :many
-- Every chunk of payload $2 in order (to check the hash once it is complete).
SELECT data FROM payload_chunks WHERE workspace_id = $1 AND sha256 = $2 ORDER BY "offset";

-- name: payload_chunks_forget :exec
-- Drop the chunks of an upload whose bytes did not match its hash.
DELETE FROM payload_chunks WHERE workspace_id = $1 AND sha256 = $2;

-- name: payload_complete :exec
-- The payload is whole and its hash checked ($3 size, $4 media type, $5 run).
INSERT INTO payloads (workspace_id, sha256, size, media_type, run_id) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (workspace_id, sha256) DO NOTHING;

-- name: payload_chunks_between :many
-- The chunks of payload $2 overlapping bytes [$3, $3 + $4).
SELECT "offset", data FROM payload_chunks
WHERE workspace_id = $1 AND sha256 = $2
  AND "offset" < $3::bigint + $4::bigint AND "offset" + length(data) > $3::bigint
ORDER BY "offset";
