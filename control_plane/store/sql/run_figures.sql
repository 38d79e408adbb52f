-- name: run_figures_of :one
-- A run's agent, status and, once finished, its seconds from admission to finish on the
-- database clock: what /metrics counts when a commit lands (control_plane/ops/run_figures.py).
SELECT agent_id, status,
       extract(epoch FROM finished_at - created_at)::float8 AS seconds
FROM runs
WHERE workspace_id = $1 AND run_id = $2;
