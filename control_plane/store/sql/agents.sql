-- name: workspace_ensure :exec
-- Create the workspace on first use (plans and caps are managed elsewhere).
INSERT INTO workspaces (workspace_id) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: agent_insert :one
-- Register an agent; returns nothing when the id is taken.
INSERT INTO agents (workspace_id, agent_id, display_name)
VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING
RETURNING workspace_id, agent_id, display_name, latest_version, created_at;

-- name: agent_get :one
-- One agent of a workspace.
SELECT workspace_id, agent_id, display_name, latest_version, created_at
FROM agents WHERE workspace_id = $1 AND agent_id = $2;

-- name: agent_version_publish :one
-- Freeze a spec as the agent's next version (the agent row lock orders
-- concurrent publishes). The spec's max_concurrency (0 or absent: none)
-- becomes the agent's cap, for the runs of every version. $4: the registry versions
-- pinned (name -> {workspace_id, version}), $5: the built-in tools it needs executors for.
WITH bumped AS (
    UPDATE agents SET latest_version = latest_version + 1,
                      max_concurrency = nullif(($3::jsonb ->> 'max_concurrency')::int, 0)
    WHERE workspace_id = $1 AND agent_id = $2
    RETURNING workspace_id, agent_id, latest_version
)
-- (The insert is a CTE too: Citus cannot plan an INSERT … SELECT from a writing CTE.)
, published AS (
    INSERT INTO agent_versions (workspace_id, agent_id, version, spec, tool_versions, code_tools)
    SELECT workspace_id, agent_id, latest_version, $3::jsonb, $4::jsonb, $5::jsonb FROM bumped
    RETURNING workspace_id, agent_id, version, spec, created_at, tool_versions
)
SELECT * FROM published;

-- name: agent_version_get :one
-- One published version; version 0 means the latest.
SELECT v.workspace_id, v.agent_id, v.version, v.spec, v.created_at, v.tool_versions,
       v.code_tools
FROM agent_versions v JOIN agents a USING (workspace_id, agent_id)
WHERE v.workspace_id = $1 AND v.agent_id = $2
  AND v.version = CASE WHEN $3::int = 0 THEN a.latest_version ELSE $3::int END;

-- name: agent_list :many
-- A page of a workspace's agents by agent id, after the id $2 (NULL: from the start).
SELECT workspace_id, agent_id, display_name, latest_version, created_at
FROM agents WHERE workspace_id = $1 AND ($2::text IS NULL OR agent_id > $2)
ORDER BY agent_id
LIMIT $3;
