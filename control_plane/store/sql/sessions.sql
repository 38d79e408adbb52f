-- name: session_insert :one
-- Open a conversation with an agent, with its strategy ($6) for a message sent while a turn
-- runs. Database clock unless $5.
INSERT INTO sessions (workspace_id, session_id, agent_id, title, created_at, updated_at, strategy)
VALUES ($1, $2, $3, $4, coalesce($5::timestamptz, now()), coalesce($5::timestamptz, now()), $6)
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

-- name: session_unfinished_lock :many
-- Share locks on the runs of the session's unfinished turns (the caller holds the session
-- row): a transaction ending one of them commits before this returns, or its end-of-turn
-- trigger waits for the caller's and then sees the caller's parked turn (migration 0021).
SELECT r.run_id FROM session_turns t
JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2 AND r.status IN ('queued', 'running', 'waiting')
FOR SHARE OF r;

-- name: session_history :one
-- The transcript turn $3 of a session carries (migration 0021's session_transcript).
SELECT session_transcript($1, $2, $3) AS history;

-- name: session_turn_park :exec
-- An enqueued turn waits (no wake_at) until the turn before it ends: the end-of-turn trigger
-- wakes it (migration 0021).
UPDATE runs SET status = 'waiting', wait_reason = 'session', wake_at = NULL, updated_at = now()
WHERE workspace_id = $1 AND run_id = $2 AND status = 'queued';

-- name: session_turn_mark_ended :exec
-- Record why a turn ended early: 'interrupt' or 'rollback' ($4).
UPDATE session_turns SET ended_by = $4 WHERE workspace_id = $1 AND session_id = $2 AND turn = $3;
