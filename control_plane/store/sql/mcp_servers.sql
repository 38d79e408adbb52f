-- name: mcp_server_insert :one
-- Registers a server; no row when the workspace already has one of that id.
INSERT INTO mcp_servers (workspace_id, server_id, url, connection, created_by, last_sync_at,
                         timeout_seconds)
VALUES (:workspace_id, :server_id, :url, :connection, :created_by, now(), :timeout_seconds)
ON CONFLICT (workspace_id, server_id) DO NOTHING
RETURNING *;

-- name: mcp_server_get :one
-- One server of a workspace.
SELECT * FROM mcp_servers WHERE workspace_id = :workspace_id AND server_id = :server_id;

-- name: mcp_server_list :many
-- A workspace's servers, by id.
SELECT * FROM mcp_servers WHERE workspace_id = :workspace_id ORDER BY server_id LIMIT :limit;

-- name: mcp_server_synced :one
-- Records a sync that saved its diff, with the calls' new deadline (:timeout_seconds; NULL
-- keeps it).
UPDATE mcp_servers
SET last_sync_at = now(), timeout_seconds = coalesce(:timeout_seconds, timeout_seconds)
WHERE workspace_id = :workspace_id AND server_id = :server_id
RETURNING *;
