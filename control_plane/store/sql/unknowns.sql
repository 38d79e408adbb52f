-- name: unknown_claim_decision :one
-- The compare-and-set of a person's decision on an unknown tool outcome: a
-- run parked for a person (wake_at NULL) becomes runnable now. Only one
-- decision can move wake_at off NULL; a concurrent one waits on the row lock,
-- re-checks, and finds nothing to update. Database clock unless $3 fixes it.
-- A repeated call held by the repetition guard waits the same way ('repeat').
-- (The clock as a subquery and now() outside the write's RETURNING: Citus refuses
-- non-immutable functions inside coalesce or in RETURNING.)
WITH decided AS (
    UPDATE runs SET wake_at = (SELECT coalesce($3::timestamptz, now())), updated_at = now()
    WHERE workspace_id = $1 AND run_id = $2
      AND status = 'waiting' AND wait_reason IN ('human', 'repeat') AND wake_at IS NULL
    RETURNING *
)
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM decided;

-- name: unknown_step_get :one
-- The step a decision names (it must be an unknown tool_result awaiting a person).
SELECT seq, kind, payload FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND seq = $3;

-- name: unknown_decision_get :one
-- The decision already recorded on an unknown outcome, if any: the
-- tool_result that answers the unknown tool_result at $3.
SELECT seq, payload, created_at FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND kind = 'tool_result' AND ref_seq = $3
ORDER BY seq
LIMIT 1;

-- name: unknown_decision_insert :one
-- Append the decision under the run's current epoch, at the next seq (the
-- caller holds the run row's lock, so no other step can take that seq).
WITH to_append AS (
    SELECT $1::text AS workspace_id, $2::uuid AS run_id, run_next_seq($1, $2) AS seq,
           'tool_result' AS kind, $4::bigint AS epoch, $3::int AS ref_seq, $5::jsonb AS payload,
           now() AS created_at, NULL::text AS release
), {{steps_append}}, counted AS (
    UPDATE runs r SET step_count = r.step_count + 1
    FROM appended a
    WHERE r.workspace_id = $1 AND r.workspace_id = a.workspace_id AND r.run_id = a.run_id
)
SELECT t.* FROM to_append t JOIN appended a USING (workspace_id, run_id, seq);
