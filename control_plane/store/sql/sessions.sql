-- name: session_insert :one
-- Open a conversation with an agent, with its strategy ($6) for a message sent while a turn
-- runs and its visibility ($7: 'workspace' or 'private'). Database clock unless $5.
INSERT INTO sessions (workspace_id, session_id, agent_id, title, created_at, updated_at, strategy,
                      visibility)
VALUES ($1, $2, $3, $4, coalesce($5::timestamptz, now()), coalesce($5::timestamptz, now()), $6,
        $7)
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
    UPDATE sessions SET turn_count = :turn,
                        updated_at = (SELECT coalesce(:now::timestamptz, now()))  -- Citus: no clock in coalesce
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
-- (workspace_running() inlined: on a Citus shard a function reading a
-- distributed table is refused.)
SELECT w.workspace_id FROM workspaces w
WHERE w.workspace_id = $1
  AND (SELECT coalesce(sum(c.n), 0) FROM workspace_running_counts c
       WHERE c.workspace_id = $1) < w.max_concurrency
FOR NO KEY UPDATE OF w;

-- name: fast_path_routing :one
-- The release routing a fast-path lease follows (release_share, as the claim reads
-- it): the share [lo, hi) of the runs on no release that release $1 takes, with
-- executors seen within $2 seconds, $3: only open releases, past their canary; and
-- the log versions it reads from and writes. Read on its own, before
-- fast_path_lease, because Citus plans no SQL function over its tables with
-- parameters inside a statement over distributed ones.
SELECT s.lo, s.hi, s.reads_from, s.writes FROM release_share($1, $2, $3) s;

-- name: fast_path_lease :one
-- Lease exactly run $2 of workspace $1 to owner $3 for $4 seconds, as the
-- claim would (lease.sql run_claim, 0029): only a queued run that is due, under
-- its agent's cap, whose version is a fast-path one needing only tools among
-- $5 (a JSON array; NULL: any), on the owner's releases $6 (its own $7 among
-- them; NULL: releases ignored), a run on none only in $7's share of them
-- ($8 to $11: fast_path_routing's lo, hi, reads_from and writes).
-- Epoch + 1, the release recorded, the hold begun; `metered`: the workspace has a
-- credit account (credits are reserved then, as after a claim). No row: the claim's.
-- Every table is filtered by $1, the running counts are subqueries (not
-- workspace_running()), and the write is a CTE with the clock read outside it: so
-- a Citus coordinator routes it to the workspace's shard.
WITH target AS (
    SELECT r.workspace_id, r.run_id FROM runs r
    JOIN workspaces w ON w.workspace_id = r.workspace_id
    JOIN agents a ON a.workspace_id = r.workspace_id AND a.agent_id = r.agent_id
    JOIN agent_versions v ON v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                         AND v.version = r.agent_version
    WHERE r.workspace_id = $1 AND w.workspace_id = $1 AND a.workspace_id = $1
      AND v.workspace_id = $1 AND r.run_id = $2
      AND r.status = 'queued' AND r.wake_at <= (SELECT now())
      -- The caps, read under the workspace lock (this statement's snapshot).
      AND (SELECT coalesce(sum(c.n), 0) FROM workspace_running_counts c
           WHERE c.workspace_id = $1) < w.max_concurrency
      AND (a.max_concurrency IS NULL
           OR (SELECT coalesce(sum(c.n), 0) FROM agent_running_counts c
               WHERE c.workspace_id = $1 AND c.agent_id = a.agent_id) < a.max_concurrency)
      AND coalesce((v.spec ->> 'fast_path')::boolean, false)
      AND ($5::jsonb IS NULL
           OR coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb)
      AND ($6::text[] IS NULL OR r.release = ANY($6::text[])
           OR (r.release IS NULL
               AND release_takes(r.run_id, $8::int, $9::int)
               AND r.log_version BETWEEN $10::int AND $11::int))
    FOR UPDATE OF r
), leased AS (
    UPDATE runs r SET
        status = 'running',
        wait_reason = NULL,
        release = coalesce(r.release, $7::text),
        log_version = CASE WHEN $7::text IS NULL THEN r.log_version
                           ELSE greatest(r.log_version, $11::int) END,
        lease_owner = $3,
        lease_epoch = r.lease_epoch + 1,
        wake_at = (SELECT now() + make_interval(secs => $4::float8)),
        held_since = (SELECT now()),
        started_at = coalesce(r.started_at, (SELECT now())),
        updated_at = now()
    FROM target
    WHERE r.workspace_id = $1 AND r.run_id = target.run_id
    RETURNING r.*
)
SELECT l.*, run_held_seconds(l.held_since, l.wake_at, now()) AS held_seconds,
    EXISTS (SELECT 1 FROM credit_accounts ca WHERE ca.workspace_id = $1) AS metered
FROM leased l;

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
-- (created_at, session_id) when given, optionally of one agent ('' = all), only those
-- reader :reader may see (NULL: all; a private one only by its members, migration 0051),
-- each with its members.
SELECT x.*, (SELECT coalesce(array_agg(m.member ORDER BY m.member), '{}') FROM session_members m
             WHERE m.workspace_id = :workspace_id AND m.session_id = x.session_id) AS members
FROM sessions x
WHERE workspace_id = :workspace_id
  AND (:agent_id::text = '' OR agent_id = :agent_id)
  AND (:reader::text IS NULL OR visibility = 'workspace'
       OR EXISTS (SELECT 1 FROM session_members m
                  WHERE m.workspace_id = :workspace_id AND m.session_id = x.session_id
                    AND m.member = :reader))
  AND (:after_time::timestamptz IS NULL OR (created_at, session_id) < (:after_time, :after_id::uuid))
ORDER BY created_at DESC, session_id DESC
LIMIT :page_size;
