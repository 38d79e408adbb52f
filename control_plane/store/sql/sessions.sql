-- name: session_insert :one
-- Open a conversation with an agent. Database clock unless $5.
INSERT INTO sessions (workspace_id, session_id, agent_id, title, created_at, updated_at)
VALUES ($1, $2, $3, $4, coalesce($5::timestamptz, now()), coalesce($5::timestamptz, now()))
RETURNING *;

-- name: session_get :one
-- One session of a workspace.
SELECT * FROM sessions WHERE workspace_id = $1 AND session_id = $2;

-- name: session_lock :one
-- One session, locked until the caller's transaction ends: concurrent sends queue here,
-- so the second sees the first one's turn.
SELECT * FROM sessions WHERE workspace_id = $1 AND session_id = $2 FOR UPDATE;

-- name: session_turns :many
-- A session's turns from turn $3 in order, each with its run's state, input and answer.
SELECT t.turn, t.run_id, t.request_id, t.created_at, r.status, r.input, r.output, r.error
FROM session_turns t
JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2 AND t.turn >= $3
ORDER BY t.turn
LIMIT $4;

-- name: session_turns_recent :many
-- The session's last $3 turns, newest first (the transcript of the next turn).
SELECT t.turn, t.run_id, t.request_id, t.created_at, r.status, r.input, r.output, r.error
FROM session_turns t
JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2
ORDER BY t.turn DESC
LIMIT $3;

-- name: session_turn_by_request :one
-- The turn a SendMessage request_id created.
SELECT t.turn, t.run_id, t.request_id, t.created_at, r.status, r.input, r.output, r.error
FROM session_turns t
JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2 AND t.request_id = $3;

-- name: session_turn_admit :one
-- Admit turn $4 of a session: its run with the limits copied ($7-$10, $13, $14), its input step
-- carrying the transcript so far ($11), the turn row and the session's count, in one
-- statement. The caller holds the session row lock. Database clock unless $12.
WITH run AS (
    INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wake_at, input,
                      max_steps, max_tokens, max_tool_calls, deadline_seconds, max_age_seconds,
                      expires_at, model_retry_budget, created_at, updated_at)
    SELECT s.workspace_id, $5, s.agent_id, $6, 'queued', coalesce($12::timestamptz, now()),
           $11::jsonb ->> 'text', $7, $8, $9, $10::int, $14::int,
           CASE WHEN $14::int > 0
               THEN coalesce($12::timestamptz, now()) + make_interval(secs => $14::int) END,
           $13::int,
           coalesce($12::timestamptz, now()), coalesce($12::timestamptz, now())
    FROM sessions s WHERE s.workspace_id = $1 AND s.session_id = $2
    RETURNING *
), input_step AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT workspace_id, run_id, 0, 'input', 0, $11::jsonb FROM run
), turn AS (
    INSERT INTO session_turns (workspace_id, session_id, turn, run_id, request_id, created_at)
    SELECT workspace_id, $2, $4, run_id, $3, created_at FROM run
), bumped AS (
    UPDATE sessions SET turn_count = $4, updated_at = coalesce($12::timestamptz, now())
    WHERE workspace_id = $1 AND session_id = $2
)
SELECT $4::int AS turn, run.run_id, $3::text AS request_id, run.created_at, run.status,
       run.input, run.output, run.error
FROM run;
