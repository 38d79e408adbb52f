-- name: approval_insert :one
-- Hold a tool call for a human (inside the commit's transaction); the
-- policy was resolved from the run's agent version. Database clock unless :now.
INSERT INTO approvals (workspace_id, approval_id, run_id, decision_seq, call_id, tool, arguments,
                       arguments_sha256, approvers, slack_approvers, high_risk, moves_money,
                       expire_at, expiry_seconds, on_expiry, escalate_to, max_reminders,
                       argument_origins)
VALUES (:workspace_id, :approval_id, :run_id, :decision_seq, :call_id, :tool,
        :arguments_json::jsonb, :arguments_sha256, :approvers, :slack_approvers, :high_risk,
        :moves_money, coalesce(:now::timestamptz, now()) + make_interval(secs => :expiry_seconds),
        :expiry_seconds, :on_expiry, :escalate_to, :max_reminders,
        :argument_origins_json::jsonb)
ON CONFLICT (workspace_id, run_id, call_id) DO NOTHING
RETURNING *;

-- name: approval_get :one
-- One approval of a workspace.
SELECT * FROM approvals WHERE workspace_id = $1 AND approval_id = $2;

-- name: approval_list :many
-- A page of approvals, newest first, optionally for one approver or state.
SELECT * FROM approvals
WHERE workspace_id = $1
  AND ($2::text IS NULL OR $2 = ANY(approvers) OR $2 = ANY(slack_approvers))
  AND ($3::text IS NULL OR ($3 = 'pending' AND decision IS NULL) OR decision = $3)
  AND ($4::timestamptz IS NULL OR (created_at, approval_id) < ($4, $5::uuid))
ORDER BY created_at DESC, approval_id DESC
LIMIT $6;

-- name: approval_run_lock :one
-- Lock the run an approval belongs to, so the decision and the run's wake
-- are one step; reports whether it still waits for this approval.
-- The steps are named by $1 and $2, not by the outer row: a Citus coordinator routes a
-- locking statement to one shard only when every table in it names the workspace.
SELECT status, wait_reason, lease_epoch,
       (SELECT coalesce(max(seq), -1) + 1 FROM steps s
        WHERE s.workspace_id = $1 AND s.run_id = $2) AS next_seq
FROM runs r WHERE workspace_id = $1 AND run_id = $2
FOR UPDATE;

-- name: approval_decide :one
-- The compare-and-set: exactly one decision wins. The clock is a subquery: Citus
-- refuses now() inside coalesce or CASE in a write (it evaluates it on the coordinator).
UPDATE approvals SET decision = $3, decided_by = $4,
                     decided_at = (SELECT coalesce($7::timestamptz, now())),
                     reason = $5, edited_arguments = $6::jsonb
WHERE workspace_id = $1 AND approval_id = $2 AND decision IS NULL
RETURNING *;

-- name: approval_decision_step :exec
-- Record the decision in the run's log and make the run runnable now
-- (database clock unless $7 fixes it; a subquery, as in approval_decide).
WITH to_append AS (
    SELECT $1::text AS workspace_id, $2::uuid AS run_id, $3::int AS seq,
           'approval_decided' AS kind, $4::bigint AS epoch, $5::int AS ref_seq,
           $6::jsonb AS payload, now() AS created_at, NULL::text AS release
), {{steps_append}}
UPDATE runs SET wake_at = (SELECT coalesce($7::timestamptz, now())), step_count = step_count + 1,
                updated_at = now()
WHERE workspace_id = $1 AND run_id = $2;

-- name: approvals_expired_workspaces :many
-- Up to $1 workspaces with a pending approval whose expiry passed, the longest
-- overdue first. No lock: on Citus this reads every shard, which a locking read may
-- not. Database clock unless $2 fixes it.
SELECT workspace_id FROM approvals
WHERE decision IS NULL AND expire_at <= coalesce($2::timestamptz, now())
GROUP BY workspace_id
ORDER BY min(expire_at)
LIMIT $1;

-- name: approvals_expired :many
-- Lock up to $1 of workspace $3's pending approvals whose expiry passed (skipping
-- ones another replica is handling; one workspace: one shard on Citus). Database
-- clock unless $2 fixes it.
SELECT * FROM approvals
WHERE workspace_id = $3 AND decision IS NULL AND expire_at <= coalesce($2::timestamptz, now())
ORDER BY expire_at
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: approval_extend :one
-- Escalate (new approvers, next level) or remind (one more reminder): a fresh expiry.
UPDATE approvals SET
    approvers = coalesce($3::text[], approvers),
    escalation_level = escalation_level + $4,
    reminders_sent = reminders_sent + $5,
    -- (One subquery: Citus refuses a stable timestamptz + interval over a column in a write.)
    expire_at = (SELECT coalesce($6::timestamptz, now()) + make_interval(secs => expiry_seconds))
WHERE workspace_id = $1 AND approval_id = $2 AND decision IS NULL
RETURNING *;

-- name: approval_token_insert :exec
-- Keep only the hash of a capability token.
INSERT INTO approval_tokens (workspace_id, token_sha256, approval_id, approver, expires_at)
VALUES ($1, $2, $3, $4, $5);

-- name: approval_token_peek :one
-- A token's approval and state, without using it (GET must never decide).
-- Database clock unless $3 fixes it.
SELECT t.approval_id, t.approver, t.used_at, t.expires_at,
       t.expires_at <= coalesce($3::timestamptz, now()) AS expired
FROM approval_tokens t WHERE t.workspace_id = $1 AND t.token_sha256 = $2;

-- name: approval_token_use :one
-- Use a token once: it must be unused and unexpired (database clock unless $3 fixes it).
UPDATE approval_tokens SET used_at = (SELECT coalesce($3::timestamptz, now()))
WHERE workspace_id = $1 AND token_sha256 = $2 AND used_at IS NULL
  AND expires_at > (SELECT coalesce($3::timestamptz, now()))
RETURNING approval_id, approver;

-- name: run_agent_spec :one
-- The agent version spec a run was admitted with (its approval policy).
SELECT v.spec FROM runs r
JOIN agent_versions v USING (workspace_id, agent_id)
WHERE r.workspace_id = $1 AND r.run_id = $2 AND v.version = r.agent_version;

-- name: approval_lock :one
-- Lock one approval row first (the expiry loop locks in the same order:
-- approval, then run), so a decision and an expiry never deadlock.
SELECT * FROM approvals WHERE workspace_id = $1 AND approval_id = $2 FOR UPDATE;

-- name: approval_close :one
-- Close an approval whose run no longer waits (no step, no wake).
UPDATE approvals SET decision = $3, decided_by = $4,
                     decided_at = (SELECT coalesce($6::timestamptz, now())), reason = $5
WHERE workspace_id = $1 AND approval_id = $2 AND decision IS NULL
RETURNING *;

-- name: approval_run_guard :one
-- What a decision on a run's approval must respect: whether its agent
-- version requires four eyes, and who started the run (a principal label
-- `kind:name`, set by StartRun; migration 0005).
SELECT coalesce((v.spec -> 'approval' ->> 'four_eyes')::boolean, false) AS four_eyes,
       r.started_by
FROM runs r
JOIN agent_versions v USING (workspace_id, agent_id)
WHERE r.workspace_id = $1 AND r.run_id = $2 AND v.version = r.agent_version;

-- name: approval_watch_count :one
-- The workspace's approval watch, and how many approvals $2 decided within its window,
-- each within max_decide_seconds of being asked (issue 48; 0 without a watch).
SELECT w.approval_watch,
       CASE WHEN w.approval_watch IS NULL THEN 0 ELSE (
           SELECT count(*) FROM approvals a
           WHERE a.workspace_id = $1 AND a.decided_by = $2 AND a.decision = 'approved'
             AND a.decided_at > now() - make_interval(
                 secs => (w.approval_watch->>'window_seconds')::int)
             AND a.decided_at - a.created_at <= make_interval(
                 secs => (w.approval_watch->>'max_decide_seconds')::int))
       END AS fast
FROM workspaces w WHERE w.workspace_id = $1;
