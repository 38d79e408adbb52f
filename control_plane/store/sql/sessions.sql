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
-- A session's turns from turn $3 in order, each with its run's state, input, answer and
-- priority.
SELECT t.turn, t.run_id, t.request_id, t.created_at, r.status, r.input, r.output, r.error,
       r.priority
FROM session_turns t
JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2 AND t.turn >= $3
ORDER BY t.turn
LIMIT $4;

-- name: session_turns_recent :many
-- The session's last $3 turns, newest first (the transcript of the next turn).
SELECT t.turn, t.run_id, t.request_id, t.created_at, r.status, r.input, r.output, r.error,
       r.priority
FROM session_turns t
JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2
ORDER BY t.turn DESC
LIMIT $3;

-- name: session_turn_by_request :one
-- The turn a SendMessage request_id created.
SELECT t.turn, t.run_id, t.request_id, t.created_at, r.status, r.input, r.output, r.error,
       r.priority
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
       input, output, error, priority
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

-- name: fast_path_lock_workspace :one
-- The fast path's first statement (control_plane/dispatch/fast_path.py): the
-- workspace row locked as a claim locks it (lease.sql, step 1), if it has room
-- under its cap. The claim skips rows locked like this and the running counts
-- only grow under this lock, so the cap holds with claims and fast paths
-- together; the lease statement after it is a new statement and sees every
-- lease taken under the lock before. The room read here is from before the
-- lock (0027_running_counts.sql): only an early no; fast_path_lease reads it again.
SELECT workspace_id FROM workspaces
WHERE workspace_id = $1 AND workspace_running(workspace_id) < max_concurrency
FOR NO KEY UPDATE;

-- name: fast_path_lease :one
-- Lease exactly run $2 of workspace $1 to owner $3 for $4 seconds, as the
-- claim would (lease.sql run_claim, 0029): only a queued run that is due, under
-- its agent's cap, whose version is a fast-path one needing only tools among
-- $5 (a JSON array; NULL: any), on the owner's releases $6 (its own $7 among
-- them; NULL: releases ignored), a run on none only in $7's share of them
-- (release_share: $8 seconds connected; $9: only open releases, past their canary).
-- Epoch + 1, the release recorded, the hold begun; `metered`: the workspace has a
-- credit account (credits are reserved then, as after a claim). No row: the claim's.
WITH routing AS MATERIALIZED (
    SELECT $6::text[] IS NULL AS any_release, s.lo, s.hi, s.reads_from, s.writes
    FROM release_share($7, $8, $9) s
), target AS (
    SELECT r.workspace_id, r.run_id FROM runs r
    JOIN workspaces w ON w.workspace_id = r.workspace_id
    JOIN agents a ON a.workspace_id = r.workspace_id AND a.agent_id = r.agent_id
    JOIN agent_versions v ON v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                         AND v.version = r.agent_version
    WHERE r.workspace_id = $1 AND r.run_id = $2
      AND r.status = 'queued' AND r.wake_at <= now()
      -- The caps, read under the workspace lock (this statement's snapshot).
      AND workspace_running(w.workspace_id) < w.max_concurrency
      AND (a.max_concurrency IS NULL OR agent_running(a.workspace_id, a.agent_id) < a.max_concurrency)
      AND coalesce((v.spec ->> 'fast_path')::boolean, false)
      AND ($5::jsonb IS NULL
           OR coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb)
      AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
           OR (r.release IS NULL
               AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
               AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                     AND (SELECT writes FROM routing)))
    FOR UPDATE OF r
)
UPDATE runs r SET
    status = 'running',
    wait_reason = NULL,
    release = coalesce(r.release, $7::text),
    log_version = greatest(r.log_version, coalesce(
        (SELECT writes FROM routing WHERE $7::text IS NOT NULL), 0)),
    lease_owner = $3,
    lease_epoch = r.lease_epoch + 1,
    wake_at = now() + make_interval(secs => $4),
    held_since = now(),
    started_at = coalesce(r.started_at, now()),
    updated_at = now()
FROM target
WHERE r.workspace_id = target.workspace_id AND r.run_id = target.run_id
RETURNING r.*, run_held_seconds(r.held_since, r.wake_at, now()) AS held_seconds,
    EXISTS (SELECT 1 FROM credit_accounts ca WHERE ca.workspace_id = r.workspace_id) AS metered;

-- name: fast_path_lapsed :one
-- How many fast-path runs hold a lapsed lease (the recovery scanner pokes the
-- claim, which takes lapsed leases first). Index runs_leases.
SELECT count(*) AS lapsed FROM runs r
JOIN agent_versions v ON v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                     AND v.version = r.agent_version
WHERE r.status = 'running' AND r.wake_at <= now()
  AND coalesce((v.spec ->> 'fast_path')::boolean, false);

-- name: sessions_page :many
-- A workspace's sessions newest first (by creation), after the page token's
-- (created_at, session_id) when given, optionally of one agent ('' = all).
SELECT * FROM sessions
WHERE workspace_id = :workspace_id
  AND (:agent_id::text = '' OR agent_id = :agent_id)
  AND (:after_time::timestamptz IS NULL OR (created_at, session_id) < (:after_time, :after_id::uuid))
ORDER BY created_at DESC, session_id DESC
LIMIT :page_size;
