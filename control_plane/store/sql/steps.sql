-- name: run_commit :one
-- The fenced commit, in one statement: lock the run row, check it is still
-- running under this epoch, append the steps, count them and bump the other
-- counters, and either renew the lease (:status NULL) or
-- apply the transition (:status = 'waiting', 'completed', 'failed'; parking and
-- finishing release the lease, and the runs_active_time trigger adds the
-- hold's time). Zero rows means fenced; unique (run_id, seq) is the backstop.
-- Database clock unless :now fixes it.
WITH locked AS (
    SELECT workspace_id, run_id FROM runs
    WHERE workspace_id = :workspace_id AND run_id = :run_id AND lease_epoch = :epoch
      AND status = 'running'
    FOR NO KEY UPDATE
), appended AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
    SELECT l.workspace_id, l.run_id, s.seq, s.kind, :epoch, s.ref_seq, s.payload
    FROM locked l,
         unnest(:seqs::int[], :kinds::text[], :ref_seqs::int[], :payloads::jsonb[])
             AS s(seq, kind, ref_seq, payload)
    RETURNING seq
)
UPDATE runs r SET
    step_count = r.step_count + (SELECT count(*) FROM appended),
    model_calls = r.model_calls + :model_calls,
    tool_calls = r.tool_calls + :tool_calls,
    tokens_used = r.tokens_used + :tokens,
    -- Usage and cost priced from the steps (control_plane/pricing.py), in this statement.
    input_tokens = r.input_tokens + :input_tokens,
    output_tokens = r.output_tokens + :output_tokens,
    cached_tokens = r.cached_tokens + :cached_tokens,
    reasoning_tokens = r.reasoning_tokens + :reasoning_tokens,
    cost_micros = r.cost_micros + :cost_micros,
    status = coalesce(:status, r.status),
    wait_reason = CASE WHEN :status = 'waiting' THEN :wait_reason END,
    waiting_connection_id = CASE WHEN :status = 'waiting' THEN :waiting_connection_id::uuid END,
    wake_at = CASE
        WHEN :status IS NULL
            THEN coalesce(:now::timestamptz, now()) + make_interval(secs => :lease_seconds)
        WHEN :status = 'waiting' THEN coalesce(:wake_at::timestamptz,
            coalesce(:now::timestamptz, now()) + make_interval(secs => :wake_after_seconds))
    END,
    lease_owner = CASE WHEN :status IS NULL THEN r.lease_owner END,
    output = CASE WHEN :status = 'completed' THEN :text END,
    error = CASE WHEN :status = 'failed' THEN :text END,
    finished_at = CASE WHEN :status IN ('completed', 'failed')
                       THEN coalesce(:now::timestamptz, now()) END,
    updated_at = now()
FROM locked
WHERE r.workspace_id = locked.workspace_id AND r.run_id = locked.run_id
-- credits_due: a metered run that spent all it reserved tops up before its next step.
RETURNING r.status, r.wake_at,
    r.credit_chunks > 0 AND r.cost_micros >= r.credits_reserved_micros AS credits_due;

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
