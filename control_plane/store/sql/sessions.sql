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
-- Admit turn :turn of a session: its run and input step (run_admit; the input carries the
-- transcript so far), the turn row and the session's count, in one statement. The caller
-- holds the session row lock. Database clock unless :now.
WITH admit_if AS (
    SELECT FROM sessions WHERE workspace_id = :workspace_id AND session_id = :session_id
), {{run_admit}}, turn AS (
    INSERT INTO session_turns (workspace_id, session_id, turn, run_id, request_id, created_at)
    SELECT workspace_id, :session_id, :turn, run_id, :turn_request_id, created_at FROM admitted
), bumped AS (
    UPDATE sessions SET turn_count = :turn, updated_at = coalesce(:now::timestamptz, now())
    WHERE workspace_id = :workspace_id AND session_id = :session_id
)
SELECT :turn::int AS turn, run_id, :turn_request_id::text AS request_id, created_at, status,
       input, output, error
FROM admitted;
