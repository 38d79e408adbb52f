-- name: run_insert :one
-- Admit a run with its limits copied from the agent version (deadline $10 of
-- active time, max age $13, 0 = none), and its input as step 0, in one
-- statement. Returns nothing when request_id was used. $14 is the label of
-- the principal who started it (four eyes reads it).
WITH run AS (
    INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wake_at,
                      request_id, input, max_steps, max_tokens, max_tool_calls,
                      deadline_seconds, max_age_seconds, expires_at, model_retry_budget,
                      started_by)
    VALUES ($1, $2, $3, $4, 'queued', coalesce($11::timestamptz, now()), $5, $6, $7, $8, $9,
            $10::int, $13::int, CASE WHEN $13::int > 0
                THEN coalesce($11::timestamptz, now()) + make_interval(secs => $13::int) END, $12,
            $14)
    ON CONFLICT (workspace_id, agent_id, request_id) WHERE request_id IS NOT NULL DO NOTHING
    RETURNING *
), input_step AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT workspace_id, run_id, 0, 'input', 0, jsonb_build_object('text', input) FROM run
)
SELECT * FROM run;

-- name: run_get :one
-- One run of a workspace, with its current hold's seconds so far (held_seconds).
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds
FROM runs WHERE workspace_id = $1 AND run_id = $2;

-- name: run_get_by_request :one
-- The run a StartRun request_id created.
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds
FROM runs WHERE workspace_id = $1 AND agent_id = $2 AND request_id = $3;

-- name: run_list :many
-- A page of a workspace's runs, newest first, after a keyset cursor.
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM runs
WHERE workspace_id = $1
  AND ($2::timestamptz IS NULL OR (created_at, run_id) < ($2, $3::uuid))
  AND ($4::text IS NULL OR agent_id = $4)
  AND ($5::text IS NULL OR status = $5)
ORDER BY created_at DESC, run_id DESC
LIMIT $6;

-- name: run_cancel :one
-- Cancel a non-terminal run at once. Its holder is fenced: the epoch check
-- of its next commit or heartbeat fails because status is no longer running.
WITH cancelled AS (
    UPDATE runs SET status = 'cancelled', wait_reason = NULL, wake_at = NULL,
                    lease_owner = NULL, error = $3, finished_at = now(), updated_at = now()
    WHERE workspace_id = $1 AND run_id = $2
      AND status IN ('queued', 'running', 'waiting')
    RETURNING *
), finish_step AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT c.workspace_id, c.run_id,
           (SELECT coalesce(max(seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = c.workspace_id AND s.run_id = c.run_id),
           'finish', c.lease_epoch, jsonb_build_object('status', 'cancelled', 'error', $3::text)
    FROM cancelled c
)
SELECT * FROM cancelled;
