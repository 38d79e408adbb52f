-- name: retention_workspaces :many
-- The workspaces that keep finished runs for a limited time, and the cutoff each one's
-- retention period gives at :now, the database's clock when NULL (runs finished before it are due for deletion).
SELECT workspace_id, coalesce(:now::timestamptz, now()) - make_interval(days => retention_days) AS cutoff
FROM workspaces WHERE retention_days > 0 ORDER BY workspace_id;

-- name: retention_delete_batch :one
-- Delete up to :batch runs of one workspace that finished before :cutoff, with every row
-- that names them, in one statement, and no more runs than keep the step rows deleted at
-- about :steps: the oldest finished runs are taken while the steps of those before them
-- stay under :steps (at least one run, however many steps it has; runs.step_count is kept
-- by every statement that writes steps), so a statement's work, WAL and commit stay small
-- whatever the runs hold (control_plane/retention.py says why). Only those candidates are
-- locked, FOR UPDATE SKIP LOCKED, so a run another transaction holds (a cancel, another
-- replica's batch) is skipped, not waited on; claims and commits touch only unfinished
-- runs, which are never chosen. When every candidate is held (another replica is deleting
-- the same oldest runs), the statement deletes none and this round ends; that replica
-- goes on. A finished parent with a child still going is kept until the child ends (the
-- child's end looks it up).
-- Every table is filtered by :ws itself, not only joined to a row that is: so Citus runs
-- the statement on the workspace's shard.
-- Foreign keys to runs are NO ACTION, checked at the statement's end, when the referencing
-- rows are gone too (run_signals cascade). Payloads are those the deleted runs uploaded,
-- and their chunks, unless a kept run's step references one (a second upload of the same
-- bytes, a fork): that payload is handed over to the kept run. Audit rows are those whose
-- object is one of the runs.
-- The statement commits without waiting for its WAL to reach the disk: set_config(...,
-- true) in its own result is SET LOCAL synchronous_commit = off for its implicit
-- transaction, read at the commit that ends it. Safe: a delete a crash loses is redone by
-- the next round (the runs are still there, finished and past their cutoff), nothing reads
-- that it happened, and Postgres replays commits in order, so no later synchronous commit
-- is kept without it. Claims' commits stay synchronous; the WAL writer flushes the
-- deleter's WAL in the background instead of an fsync per statement competing with theirs.
WITH candidates AS (
    SELECT o.run_id FROM (
        SELECT r.run_id,
               sum(r.step_count) OVER (ORDER BY r.finished_at ROWS UNBOUNDED PRECEDING)
                   - r.step_count AS steps_before
        FROM runs r
        WHERE r.workspace_id = :ws AND r.finished_at IS NOT NULL AND r.finished_at < :cutoff
          AND NOT EXISTS (
              SELECT 1 FROM runs c
              WHERE c.workspace_id = :ws AND c.workspace_id = r.workspace_id
                AND c.parent_run_id = r.run_id
                AND c.finished_at IS NULL)
        ORDER BY r.finished_at
        LIMIT :batch) o
    WHERE o.steps_before < :steps
), chosen AS (
    -- An index probe per candidate (= ANY of an array), whatever plan is cached.
    SELECT r.workspace_id, r.run_id FROM runs r
    WHERE r.workspace_id = :ws AND r.run_id = ANY (ARRAY(SELECT run_id FROM candidates))
      AND r.finished_at IS NOT NULL
    FOR UPDATE OF r SKIP LOCKED
), gone_steps AS (
    DELETE FROM steps s USING chosen c
    WHERE s.workspace_id = :ws AND s.workspace_id = c.workspace_id AND s.run_id = c.run_id
    RETURNING 1
), gone_events AS (
    DELETE FROM trigger_events e USING chosen c
    WHERE e.workspace_id = :ws AND e.workspace_id = c.workspace_id AND e.run_id = c.run_id
    RETURNING 1
), gone_turns AS (
    DELETE FROM session_turns t USING chosen c
    WHERE t.workspace_id = :ws AND t.workspace_id = c.workspace_id AND t.run_id = c.run_id
    RETURNING 1
), gone_approvals AS (
    DELETE FROM approvals a USING chosen c
    WHERE a.workspace_id = :ws AND a.workspace_id = c.workspace_id AND a.run_id = c.run_id
    RETURNING a.workspace_id, a.approval_id
), gone_questions AS (
    DELETE FROM unknown_questions q USING chosen c
    WHERE q.workspace_id = :ws AND q.workspace_id = c.workspace_id AND q.run_id = c.run_id
    RETURNING 1
), gone_tokens AS (
    DELETE FROM approval_tokens k USING gone_approvals a
    WHERE k.workspace_id = :ws AND k.workspace_id = a.workspace_id
      AND k.approval_id = a.approval_id
    RETURNING 1
), referenced AS (
    -- The deleted runs' payloads that a step of a run kept still references, and one such run.
    SELECT p.workspace_id, p.sha256, min(s.run_id::text)::uuid AS heir
    FROM payloads p
    JOIN chosen c ON p.workspace_id = :ws AND p.workspace_id = c.workspace_id
                  AND p.run_id = c.run_id
    JOIN steps s ON s.workspace_id = :ws AND s.workspace_id = p.workspace_id
        AND s.kind = 'tool_result'
        AND s.payload ? 'payload' AND (s.payload -> 'payload' ->> 'sha256') = p.sha256
    WHERE NOT EXISTS (
        SELECT 1 FROM chosen d WHERE d.workspace_id = s.workspace_id AND d.run_id = s.run_id)
    GROUP BY p.workspace_id, p.sha256
), handed_over AS (
    UPDATE payloads p SET run_id = r.heir FROM referenced r
    WHERE p.workspace_id = :ws AND p.workspace_id = r.workspace_id AND p.sha256 = r.sha256
    RETURNING 1
), gone_payloads AS (
    DELETE FROM payloads p USING chosen c
    WHERE p.workspace_id = :ws AND p.workspace_id = c.workspace_id AND p.run_id = c.run_id
      AND NOT EXISTS (
          SELECT 1 FROM referenced r
          WHERE r.workspace_id = :ws AND r.workspace_id = p.workspace_id AND r.sha256 = p.sha256)
    RETURNING p.workspace_id, p.sha256
), gone_chunks AS (
    DELETE FROM payload_chunks k USING gone_payloads p
    WHERE k.workspace_id = :ws AND k.workspace_id = p.workspace_id AND k.sha256 = p.sha256
    RETURNING 1
), gone_audit AS (
    DELETE FROM audit_log l USING chosen c
    WHERE l.workspace_id = :ws AND l.workspace_id = c.workspace_id AND l.object_kind = 'run'
      AND l.object_id = c.run_id::text
    RETURNING 1
), gone_runs AS (
    DELETE FROM runs r USING chosen c
    WHERE r.workspace_id = :ws AND r.workspace_id = c.workspace_id AND r.run_id = c.run_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone_runs)::integer AS runs,
       (SELECT count(*) FROM gone_steps)::integer AS steps,
       (SELECT count(*) FROM gone_events)::integer AS events,
       (SELECT count(*) FROM gone_payloads)::integer AS payloads,
       (SELECT count(*) FROM gone_audit)::integer AS audit,
       set_config('synchronous_commit', 'off', true) AS synchronous_commit;

-- name: workspace_set_retention :one
-- Keep a workspace's finished runs for :days days (0: forever).
UPDATE workspaces SET retention_days = :days WHERE workspace_id = :ws
-- (The running count is read by a subquery here, not workspace_running(): on Citus the
-- statement runs on the shard, where a function reading a distributed table is refused.)
RETURNING workspace_id, plan, max_concurrency,
          (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
           WHERE c.workspace_id = :ws) AS running,
          retention_days;
