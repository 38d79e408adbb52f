-- name: workspace_set_plan :one
-- Put a workspace (created if new) on a plan: its cap becomes the plan's, or
-- $3 when given (required for a plan without one, such as enterprise).
-- Nothing when the plan does not exist.
-- (The running count is read by a subquery here, not workspace_running(): on Citus
-- the statement runs on the shard, where a function reading a distributed table is
-- refused.)
WITH placed AS (
    INSERT INTO workspaces (workspace_id, plan, max_concurrency)
    SELECT $1, p.plan, coalesce($3::int, p.max_concurrency) FROM plans p WHERE p.plan = $2
    ON CONFLICT (workspace_id) DO UPDATE
        SET plan = excluded.plan, max_concurrency = excluded.max_concurrency
    RETURNING workspace_id, plan, max_concurrency
)
SELECT workspace_id, plan, max_concurrency,
       (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
        WHERE c.workspace_id = $1) AS running
FROM placed;

-- name: workspace_get :one
-- A workspace's plan, cap and what it runs now.
-- (The running count is read by a subquery here, not workspace_running(): on Citus
-- the statement runs on the shard, where a function reading a distributed table is
-- refused.)
SELECT workspace_id, plan, max_concurrency,
       (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
        WHERE c.workspace_id = $1) AS running,
       retention_days, approval_watch, allowlists, wait_limits
FROM workspaces WHERE workspace_id = $1;

-- name: workspace_next_wake :one
-- When the claim next looks at the workspace (workspace_turns, 0047: on the coordinator
-- under Citus, so apart from workspace_get, which runs on the workspace's shard).
SELECT next_wake_at FROM workspace_turns WHERE workspace_id = $1;

-- name: workspace_set_allowlist :one
-- One named allowlist of the workspace (issue 48; NULL values: removed).
UPDATE workspaces SET allowlists = CASE WHEN $3::jsonb IS NULL THEN allowlists - $2::text
                                        ELSE jsonb_set(allowlists, ARRAY[$2::text], $3::jsonb) END
WHERE workspace_id = $1
RETURNING workspace_id, plan, max_concurrency,
          (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
           WHERE c.workspace_id = $1) AS running,
          retention_days, approval_watch, allowlists, wait_limits;

-- name: workspace_allowlists :one
-- The named allowlists of a workspace a run's rules name (issue 48), read at assignment.
SELECT coalesce(jsonb_object_agg(k, allowlists->k) FILTER (WHERE allowlists ? k), '{}') AS lists
FROM workspaces, unnest($2::text[]) AS k
WHERE workspace_id = $1;

-- name: workspace_set_approval_watch :one
-- When an approver is flagged for approving too fast (issue 48; NULL: never).
UPDATE workspaces SET approval_watch = $2::jsonb WHERE workspace_id = $1
-- (The running count is read by a subquery here, as in workspace_get.)
RETURNING workspace_id, plan, max_concurrency,
          (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
           WHERE c.workspace_id = $1) AS running,
          retention_days, approval_watch, allowlists, wait_limits;

-- name: workspace_set_wait_limit :one
-- One wait kind's limit in seconds ($3; 0 = off), or back to the default ($3 NULL).
UPDATE workspaces SET wait_limits = CASE WHEN $3::bigint IS NULL THEN wait_limits - $2::text
                                         ELSE wait_limits || jsonb_build_object($2::text, $3::bigint)
                                    END
WHERE workspace_id = $1
RETURNING workspace_id, plan, max_concurrency,
          (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
           WHERE c.workspace_id = $1) AS running,
          retention_days, approval_watch, allowlists, wait_limits;

-- name: agent_set_max_concurrency :one
-- Cap how many runs of one agent execute at once (NULL: no cap of its own).
UPDATE agents SET max_concurrency = $3
WHERE workspace_id = $1 AND agent_id = $2
-- (The running count is read by a subquery here, not agent_running(): on Citus the
-- statement runs on the shard, where a function reading a distributed table is refused.)
RETURNING workspace_id, agent_id, max_concurrency,
          (SELECT coalesce(sum(c.n), 0)::bigint FROM agent_running_counts c
           WHERE c.workspace_id = $1 AND c.agent_id = $2) AS running;
