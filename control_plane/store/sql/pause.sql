-- Pause and resume (0045_orchestration.sql): runs, agents and a workspace's queue. The claim
-- skips what is paused; resuming lowers the workspace's next_wake_at to the earliest wake of
-- what it frees, so the next claim looks.

-- name: run_pause :one
-- PauseRun: mark an unfinished run paused (a running one is then asked to hand itself back).
-- (The write in a CTE and the clock outside it: Citus allows no clock in RETURNING.)
WITH paused AS (
    UPDATE runs SET paused = true, updated_at = now()
    WHERE workspace_id = $1 AND run_id = $2 AND status IN ('queued', 'running', 'waiting')
    RETURNING *
)
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM paused;

-- name: run_resume :one
-- ResumeRun: a paused run is claimable again, due as its wait says. The caller then lowers
-- its workspace's turn to that wake (workspace_lower_wake) in the same transaction.
WITH resumed AS (
    UPDATE runs SET paused = false, updated_at = now()
    WHERE workspace_id = $1 AND run_id = $2 AND paused
    RETURNING *
)
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM resumed;

-- name: agent_set_paused :one
-- SetQueuePaused(agent_id): hold or free an agent's runs; its queued or waiting runs, and
-- the earliest wake among them, which the caller lowers the turn to when freeing them
-- (workspace_lower_wake), as run_resume's does.
WITH agent AS (
    UPDATE agents SET paused = $3 WHERE workspace_id = $1 AND agent_id = $2
    RETURNING workspace_id, agent_id
)
SELECT (SELECT count(*) FROM agent) AS found,
       (SELECT count(*) FROM runs r, agent a
        WHERE r.workspace_id = $1 AND r.workspace_id = a.workspace_id AND r.agent_id = a.agent_id
          AND r.status IN ('queued', 'waiting')) AS queued_runs,
       (SELECT min(r.wake_at) FROM runs r, agent a
        WHERE r.workspace_id = $1 AND r.workspace_id = a.workspace_id AND r.agent_id = a.agent_id
          AND r.status IN ('queued', 'waiting')) AS first_wake;

-- name: workspace_set_queue_paused :one
-- SetQueuePaused(workspace): the claim leases no fresh run of the workspace while set (its
-- turn's raise then looks past its queued runs, 0047); resuming lowers its next_wake_at to
-- the earliest wake of its queued or waiting runs (first_wake; the caller lowers it with
-- workspace_lower_wake), so the next claim looks.
WITH ws AS (
    UPDATE workspaces SET queue_paused = $2 WHERE workspace_id = $1 RETURNING workspace_id
)
SELECT (SELECT count(*) FROM ws) AS found,
       (SELECT count(*) FROM runs WHERE workspace_id = $1
          AND status IN ('queued', 'waiting')) AS queued_runs,
       (SELECT min(r.wake_at) FROM runs r, ws
        WHERE r.workspace_id = $1 AND r.workspace_id = ws.workspace_id
          AND r.status IN ('queued', 'waiting')) AS first_wake;

-- name: workspace_lower_wake :exec
-- Lower a workspace's turn to a wake the statement before made due (workspace_lower_next_wake:
-- the turn on one PostgreSQL, a co-located wake row the claim folds in on Citus, 0047). A
-- statement of its own: called from a statement over the workspace's rows, Citus sends the
-- whole statement to the shard, where the function may not write a distributed table
-- ("cannot execute a distributed query from a query on a shard").
SELECT workspace_lower_next_wake($1, $2);

-- name: run_held_by_pause :one
-- Whether a run's agent or its workspace's queue is paused (GetRun's queue cause).
SELECT coalesce((SELECT paused FROM agents WHERE workspace_id = $1 AND agent_id = $2), false)
       OR coalesce((SELECT queue_paused FROM workspaces WHERE workspace_id = $1), false) AS paused;
