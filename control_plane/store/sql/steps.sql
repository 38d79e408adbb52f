-- name: run_commit :one
-- The fenced commit, in one statement: lock the run row, check it is still
-- running under this epoch, append the steps (the steps_count trigger counts
-- them), bump the other counters, and either renew the lease ($10 NULL) or
-- apply the transition ($10 = 'waiting', 'completed', 'failed'; parking and
-- finishing release the lease, and the runs_active_time trigger adds the
-- hold's time). Zero rows means fenced; unique (run_id, seq) is the backstop.
WITH locked AS (
    SELECT workspace_id, run_id FROM runs
    WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running'
    FOR NO KEY UPDATE
), appended AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
    SELECT l.workspace_id, l.run_id, s.seq, s.kind, $3, s.ref_seq, s.payload
    FROM locked l,
         unnest($4::int[], $5::text[], $6::int[], $7::jsonb[]) AS s(seq, kind, ref_seq, payload)
    RETURNING seq
)
UPDATE runs r SET
    model_calls = r.model_calls + $8,
    tool_calls = r.tool_calls + $9,
    tokens_used = r.tokens_used + $15,
    status = coalesce($10, r.status),
    wait_reason = CASE WHEN $10 = 'waiting' THEN $11 END,
    wake_at = CASE
        WHEN $10 IS NULL THEN now() + make_interval(secs => $14)
        WHEN $10 = 'waiting' THEN coalesce($12::timestamptz, now() + make_interval(secs => $13))
    END,
    lease_owner = CASE WHEN $10 IS NULL THEN r.lease_owner END,
    output = CASE WHEN $10 = 'completed' THEN $16 END,
    error = CASE WHEN $10 = 'failed' THEN $16 END,
    finished_at = CASE WHEN $10 IN ('completed', 'failed') THEN now() END,
    updated_at = now()
FROM locked
WHERE r.workspace_id = locked.workspace_id AND r.run_id = locked.run_id
RETURNING r.status, r.wake_at;

-- name: steps_by_seqs :many
-- Which of these seqs exist, under which epoch (recognises a retried commit).
SELECT seq, epoch, kind FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND seq = ANY($3::int[]);

-- name: steps_list :many
-- A run's steps in order from a seq.
SELECT * FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND seq >= $3
ORDER BY seq
LIMIT $4;

-- name: steps_for_runs :many
-- The whole step logs of several runs (for assignments).
SELECT s.* FROM steps s
JOIN unnest($1::text[], $2::uuid[]) AS r(workspace_id, run_id)
  ON s.workspace_id = r.workspace_id AND s.run_id = r.run_id
ORDER BY s.run_id, s.seq;
