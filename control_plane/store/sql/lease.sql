-- name: run_claim_due :many
-- Lock up to cardinality($1) due runs (a queued run, a finished wait, or a
-- lapsed lease), skipping rows other claimers hold, and lease each to the
-- owner at the same position of $1. Database clock unless $3 fixes it.
WITH due AS (
    SELECT workspace_id, run_id, status,
           row_number() OVER () AS slot
    FROM (
        SELECT workspace_id, run_id, status FROM runs
        WHERE status IN ('queued', 'running', 'waiting')
          AND wake_at <= coalesce($3::timestamptz, now())
        ORDER BY wake_at
        LIMIT cardinality($1::text[])
        FOR UPDATE SKIP LOCKED
    ) picked
)
UPDATE runs r SET
    status = 'running',
    wait_reason = NULL,
    lease_owner = ($1::text[])[due.slot],
    lease_epoch = r.lease_epoch + 1,
    attempt = r.attempt + (due.status = 'running')::int,
    wake_at = coalesce($3::timestamptz, now()) + make_interval(secs => $2),
    started_at = coalesce(r.started_at, now()),
    updated_at = now()
FROM due
WHERE r.workspace_id = due.workspace_id AND r.run_id = due.run_id
RETURNING r.*;

-- name: run_heartbeat :many
-- Renew every lease an executor holds, in one statement. A lease missing
-- from the result was lost (taken, cancelled, finished or past deadline).
UPDATE runs r SET wake_at = now() + make_interval(secs => $5), updated_at = now()
FROM unnest($2::text[], $3::uuid[], $4::bigint[]) AS h(workspace_id, run_id, epoch)
WHERE r.workspace_id = h.workspace_id AND r.run_id = h.run_id
  AND r.lease_epoch = h.epoch AND r.lease_owner = $1 AND r.status = 'running'
  AND r.deadline_at > now()
RETURNING r.workspace_id, r.run_id, r.lease_epoch, r.wake_at;

-- name: run_fail_past_deadline :many
-- Fail held runs whose deadline passed (the heartbeat refused them).
WITH failed AS (
    UPDATE runs r SET status = 'failed', error = 'deadline exceeded', wake_at = NULL,
                      lease_owner = NULL, finished_at = now(), updated_at = now()
    FROM unnest($1::text[], $2::uuid[], $3::bigint[]) AS h(workspace_id, run_id, epoch)
    WHERE r.workspace_id = h.workspace_id AND r.run_id = h.run_id
      AND r.lease_epoch = h.epoch AND r.status = 'running' AND r.deadline_at <= now()
    RETURNING r.workspace_id, r.run_id, r.lease_epoch
), finish_step AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT f.workspace_id, f.run_id,
           (SELECT coalesce(max(seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = f.workspace_id AND s.run_id = f.run_id),
           'finish', f.lease_epoch,
           jsonb_build_object('status', 'failed', 'error', 'deadline exceeded')
    FROM failed f
)
SELECT * FROM failed;

-- name: run_release_unassigned :exec
-- Give back a just-claimed run that could not be delivered (its executor
-- went away): runnable again now, under a new epoch at the next claim.
UPDATE runs SET status = 'waiting', wait_reason = 'handoff', lease_owner = NULL,
                wake_at = now(), updated_at = now()
WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running';
