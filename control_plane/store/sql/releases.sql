-- Releases (0020_releases.sql): which executors serve each, what they hold, drains.

-- name: release_seen :exec
-- Executors of the releases $1 are connected: each is known from now on.
INSERT INTO releases (release)
SELECT DISTINCT r FROM unnest($1::text[]) AS r WHERE r <> ''
ON CONFLICT DO NOTHING;

-- name: release_declared :exec
-- An executor of release $1 connected, writing step-log version $2 and reading from $3:
-- the release is known from now on (release_seen), with those versions.
INSERT INTO releases AS rl (release, log_version, log_reads_from)
VALUES ($1, $2, $3)
ON CONFLICT (release) DO UPDATE
SET log_version = EXCLUDED.log_version, log_reads_from = EXCLUDED.log_reads_from
WHERE (rl.log_version, rl.log_reads_from)
      IS DISTINCT FROM (EXCLUDED.log_version, EXCLUDED.log_reads_from);

-- name: release_list :many
-- Every known release ($1 NULL) or one, newest first, with its executors seen
-- within $2 seconds, the runs it holds (and when the oldest hold began), the runs
-- pinned to it that wait for one of its executors, and the runs that finished on it.
-- The runs are counted in one grouped read and the executors (a coordinator-local
-- table) in a CTE, both joined to the reference table `releases`: Citus plans that,
-- and refuses correlated subqueries beside a reference table or a direct join of a
-- local table with distributed ones (as releases_draining).
WITH counted AS (
    SELECT r.release,
           count(*) FILTER (WHERE r.status = 'running') AS runs_held,
           min(r.held_since) FILTER (WHERE r.status = 'running') AS oldest_held_since,
           count(*) FILTER (WHERE r.status IN ('queued', 'waiting')) AS runs_waiting,
           count(*) FILTER (WHERE r.status = 'completed') AS runs_completed,
           count(*) FILTER (WHERE r.status = 'failed') AS runs_failed
    FROM runs r
    WHERE r.release IS NOT NULL AND ($1::text IS NULL OR r.release = $1)
      AND r.status IN ('running', 'queued', 'waiting', 'completed', 'failed')
    GROUP BY r.release
), seen AS (
    SELECT e.release, array_agg(e.executor_id ORDER BY e.executor_id) AS executors
    FROM executor_tools e
    WHERE e.last_seen > now() - make_interval(secs => $2)
      AND ($1::text IS NULL OR e.release = $1)
    GROUP BY e.release
)
SELECT rl.release, rl.first_seen_at, rl.promoted_at, rl.draining_since, rl.drain_deadline,
       rl.canary_passed_at, rl.canary_failed_at, rl.canary_failure, rl.ramp_percent,
       rl.rolled_back_at,
       coalesce(s.executors, '{}') AS executors,
       coalesce(c.runs_held, 0) AS runs_held,
       c.oldest_held_since,
       coalesce(c.runs_waiting, 0) AS runs_waiting,
       coalesce(c.runs_completed, 0) AS runs_completed,
       coalesce(c.runs_failed, 0) AS runs_failed,
       now() AS now
FROM releases rl
LEFT JOIN counted c ON c.release = rl.release
LEFT JOIN seen s ON s.release = rl.release
WHERE $1::text IS NULL OR rl.release = $1
ORDER BY coalesce(rl.promoted_at, rl.first_seen_at) DESC, rl.release DESC;

-- name: release_runs :many
-- The runs release $1 holds or that wait pinned to it, oldest hold or wait first
-- (at most $2): what an operator looks at when a drain is not done.
SELECT workspace_id, run_id, status, wait_reason FROM runs
WHERE release = $1 AND status IN ('queued', 'running', 'waiting')
ORDER BY held_since NULLS LAST, run_id
LIMIT $2;

-- name: release_drain :one
-- Start draining a release (again: a new deadline, $2 seconds from now; NULL: each
-- executor's own, the longest turn it holds), forced ($3) or not. A forced drain
-- stays forced.
UPDATE releases SET draining_since = coalesce(draining_since, (SELECT now())),
                    drain_deadline = now() + make_interval(secs => $2),
                    drain_forced = drain_forced OR $3
WHERE release = $1
RETURNING release, draining_since, drain_deadline;

-- name: release_ramp :one
-- Route $2 percent of the runs on no release to release $1 (release_share): a ramp
-- ends its drain or rollback, as a promote does, and leaves it unpromoted.
UPDATE releases SET ramp_percent = $2, promoted_at = NULL, draining_since = NULL,
                    drain_deadline = NULL, drain_forced = false, rolled_back_at = NULL
WHERE release = $1
RETURNING release;

-- name: release_rollback :one
-- Roll release $1 back: no ramp, no promote, drained (its turns finish, its parked
-- runs continue on the newest other release), deadline as release_drain's.
UPDATE releases SET ramp_percent = NULL, promoted_at = NULL, rolled_back_at = now(),
                    draining_since = coalesce(draining_since, (SELECT now())),
                    drain_deadline = now() + make_interval(secs => $2)
WHERE release = $1
RETURNING release;

-- name: release_promote :one
-- Make a release the newest (new runs go to it while it has executors); a
-- promote ends a drain, a ramp or a rollback of it.
UPDATE releases SET promoted_at = now(), draining_since = NULL, drain_deadline = NULL,
                    drain_forced = false, ramp_percent = NULL, rolled_back_at = NULL
WHERE release = $1
RETURNING release, promoted_at;

-- name: releases_draining :many
-- The releases draining now, with the seconds left to their deadline (NULL: each
-- executor's own), whether the drain is forced, and how many runs pinned to the
-- release wait for one of its executors (handed back mid-turn, or their lease
-- lapsed): an executor of it that connects serves those before it is told to drain.
-- (The waiting runs are counted in a grouped CTE, which Citus plans; a correlated
-- subquery beside the reference table `releases` it refuses.)
WITH waiting AS (
    SELECT r.release, count(*) AS n FROM runs r
    WHERE r.release IS NOT NULL
      AND (r.status IN ('queued', 'waiting') OR (r.status = 'running' AND r.wake_at <= now()))
    GROUP BY r.release
)
SELECT rl.release,
       greatest(0, extract(epoch FROM rl.drain_deadline - now()))::float8 AS seconds_left,
       rl.drain_forced AS forced,
       coalesce(w.n, 0) AS waiting
FROM releases rl LEFT JOIN waiting w ON w.release = rl.release
WHERE rl.draining_since IS NOT NULL;

-- name: release_connected :one
-- Whether an executor of release $1 was seen within $2 seconds.
SELECT EXISTS (
    SELECT 1 FROM executor_tools
    WHERE release = $1 AND last_seen > now() - make_interval(secs => $2)) AS connected;

-- name: run_lock_for_move :one
-- The run to move, locked; nothing when it does not exist.
SELECT status, release FROM runs WHERE workspace_id = $1 AND run_id = $2 FOR NO KEY UPDATE;

-- name: run_move_release :exec
-- Put a run that nobody holds on release $3 (NULL: on none, so the newest takes it).
UPDATE runs SET release = $3, updated_at = now()
WHERE workspace_id = $1 AND run_id = $2 AND status IN ('queued', 'waiting');

-- name: run_pin_release :exec
-- Put a run just admitted (in the same transaction) on release $3 before any claim sees it.
UPDATE runs SET release = $3 WHERE workspace_id = $1 AND run_id = $2 AND status = 'queued';

-- name: release_canary_passed :exec
-- A canary passed on release $1.
UPDATE releases SET canary_passed_at = now() WHERE release = $1;
