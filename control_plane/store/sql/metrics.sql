-- name: metrics_runs_by_state :many
-- Unfinished runs by workspace, status and wait reason, counted when /metrics is
-- scraped (not kept as counters that drift); the partial indexes over unfinished
-- runs serve it. Finished runs are never scanned.
SELECT workspace_id, status, coalesce(wait_reason, '') AS wait_reason, count(*) AS runs
FROM runs
WHERE status IN ('queued', 'running', 'waiting')
GROUP BY workspace_id, status, wait_reason;

-- name: metrics_unknowns_awaiting :many
-- Runs waiting for a person to say what an unknown tool outcome was (or whether a
-- repeated call may go on), by workspace: parked with no wake time yet.
SELECT workspace_id, count(*) AS runs
FROM runs
WHERE status = 'waiting' AND wait_reason IN ('human', 'repeat') AND wake_at IS NULL
GROUP BY workspace_id;

-- name: metrics_approvals_pending :many
-- Undecided approvals by workspace, and the age of the oldest (database clock).
SELECT workspace_id, count(*) AS pending,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_seconds
FROM approvals
WHERE decision IS NULL
GROUP BY workspace_id;

-- name: metrics_outbox_backlog :one
-- Notifications not delivered yet, and the age of the oldest.
SELECT count(*) AS backlog,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_seconds
FROM outbox
WHERE delivered_at IS NULL;

-- name: metrics_schedules_overdue :one
-- How far behind the scheduler is: the most overdue enabled schedule's lateness
-- (0 when every due slot has fired), and how many are due.
SELECT count(*) AS due,
       coalesce(extract(epoch FROM now() - min(next_fire_at)), 0)::float8 AS lag_seconds
FROM triggers
WHERE kind = 'schedule' AND enabled AND next_fire_at <= now();

-- name: health_ping :one
-- Readiness: the database answers.
SELECT 1 AS ok;
