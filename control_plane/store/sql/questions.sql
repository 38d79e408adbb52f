-- name: question_insert :one
-- Record the question an unknown outcome asks (inside the park's transaction); a park
-- resent after it landed asks nothing twice. Database clock unless :now.
INSERT INTO unknown_questions (workspace_id, run_id, seq, tool, recipients, slack_recipients,
                               every_seconds, on_timeout, escalate_to, max_reminders, call, next_at)
VALUES (:workspace_id, :run_id, :seq, :tool, :recipients, :slack_recipients, :every_seconds::int,
        :on_timeout, :escalate_to, :max_reminders, :call_json::jsonb,
        coalesce(:now::timestamptz, now()) + make_interval(secs => :every_seconds::int))
ON CONFLICT (workspace_id, run_id, seq) DO NOTHING
RETURNING *;

-- name: question_get :one
-- One question: the unknown tool_result at $3 of run $2.
SELECT * FROM unknown_questions WHERE workspace_id = $1 AND run_id = $2 AND seq = $3;

-- name: question_close :exec
-- Close an open question with why (a person answered it), in the answer's transaction.
UPDATE unknown_questions SET closed_at = now(), closed_reason = $4
WHERE workspace_id = $1 AND run_id = $2 AND seq = $3 AND closed_at IS NULL;

-- name: questions_due_workspaces :many
-- Up to $1 workspaces with an open question whose next action is due, the longest
-- overdue first. No lock (on Citus it reads every shard). Database clock unless $2.
SELECT workspace_id FROM unknown_questions
WHERE closed_at IS NULL AND next_at <= coalesce($2::timestamptz, now())
GROUP BY workspace_id
ORDER BY min(next_at)
LIMIT $1;

-- name: questions_due :many
-- Lock up to $1 of workspace $3's open questions whose next action is due (skipping ones
-- another replica is handling). Database clock unless $2 fixes it.
SELECT * FROM unknown_questions
WHERE workspace_id = $3 AND closed_at IS NULL AND next_at <= coalesce($2::timestamptz, now())
ORDER BY next_at
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: question_advance :one
-- Remind (one more reminder) or escalate (new recipients, next level): a fresh next_at.
UPDATE unknown_questions SET
    recipients = coalesce($4::text[], recipients),
    escalation_level = escalation_level + $5,
    reminders_sent = reminders_sent + $6,
    next_at = (SELECT coalesce($7::timestamptz, now()) + make_interval(secs => every_seconds))
WHERE workspace_id = $1 AND run_id = $2 AND seq = $3 AND closed_at IS NULL
RETURNING *;

-- name: question_fail_run :one
-- The policy ran out: fail the run still waiting for this answer (its trigger closes the
-- question, runs_close_approvals_on_finish). Nothing when it no longer waits. Database
-- clock unless $4 fixes it.
WITH failed AS (
    UPDATE runs SET status = 'failed', error = $3, wait_reason = NULL, wake_at = NULL,
                    lease_owner = NULL, step_count = step_count + 1,
                    finished_at = (SELECT coalesce($4::timestamptz, now())), updated_at = now()
    WHERE workspace_id = $1 AND run_id = $2
      AND status = 'waiting' AND wait_reason = 'human' AND wake_at IS NULL
    RETURNING *
), to_append AS (
    SELECT f.workspace_id, f.run_id, run_next_seq(f.workspace_id, f.run_id) AS seq,
           'finish' AS kind, f.lease_epoch AS epoch, NULL::int AS ref_seq,
           jsonb_build_object('status', 'failed', 'error', $3::text) AS payload,
           now() AS created_at, NULL::text AS release
    FROM failed f
), {{steps_append}}
SELECT workspace_id, run_id FROM failed;
