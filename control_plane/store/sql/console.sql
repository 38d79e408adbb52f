-- name: console_session_insert :exec
-- A signed-in browser's session: the SHA-256 of its cookie token (never the token) and the
-- principal it acts as, for ttl_seconds from now (database clock).
INSERT INTO console_sessions (session_sha256, workspace_id, kind, principal, role,
                              credential_id, expires_at)
VALUES (:session_sha256, :workspace_id, :kind, :principal, :role, :credential_id,
        now() + make_interval(secs => :ttl_seconds::double precision));

-- name: console_session_get :one
-- The live session of a cookie token's SHA-256 (expired ones are not sessions).
SELECT workspace_id, kind, principal, role, credential_id, expires_at
FROM console_sessions WHERE session_sha256 = $1 AND expires_at > now();

-- name: console_session_delete :exec
-- Sign out: the session is gone (its cookie names nothing any more).
DELETE FROM console_sessions WHERE session_sha256 = $1;

-- name: console_session_purge :exec
-- Drop sessions that expired (called at sign-in; expired rows are never read anyway).
DELETE FROM console_sessions WHERE expires_at <= now();

-- name: console_run_filter :fragment
-- The console's runs-list filters, each left out when NULL: status, agent, the trigger whose
-- event started it, wait reason, created in [created_from, created_to), and search text (a
-- run id, or a case-insensitive substring of the input, output or error; strpos, so % and _
-- are not wildcards); only runs reader :reader may see (NULL: all; control_plane/auth/privacy.py).
r.workspace_id = :workspace_id
  AND (:status::text IS NULL OR r.status = :status)
  AND (:agent_id::text IS NULL OR r.agent_id = :agent_id)
  AND (:trigger_id::text IS NULL OR te.trigger_id = :trigger_id)
  AND (:wait_reason::text IS NULL OR r.wait_reason = :wait_reason)
  AND (:created_from::timestamptz IS NULL OR r.created_at >= :created_from)
  AND (:created_to::timestamptz IS NULL OR r.created_at < :created_to)
  AND (:search::text IS NULL OR r.run_id::text = lower(:search)
       OR strpos(lower(r.input), lower(:search)) > 0
       OR strpos(lower(coalesce(r.output, '')), lower(:search)) > 0
       OR strpos(lower(coalesce(r.error, '')), lower(:search)) > 0)
  AND {{run_visible(r, :workspace_id, :reader)}}

-- name: console_run_search :many
-- The console's runs list, newest first: the filtered runs older than the keyset cursor
-- (at_created, at_run_id) — all of them when the cursor is NULL. The keyset reads
-- runs_by_created; there is no OFFSET, so a page costs the same however deep it is.
SELECT r.*, run_held_seconds(r.held_since, r.wake_at, now()) AS held_seconds,
       te.trigger_id
FROM runs r
LEFT JOIN trigger_events te ON te.run_id = r.run_id AND te.workspace_id = r.workspace_id
WHERE {{console_run_filter}}
  AND (:at_created::timestamptz IS NULL OR (r.created_at, r.run_id) < (:at_created, :at_run_id::uuid))
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT :limit;

-- name: console_run_search_newer :many
-- The console's "previous" page: the filtered runs newer than the keyset cursor, nearest
-- first (oldest first; the caller reverses them to newest first).
SELECT r.*, run_held_seconds(r.held_since, r.wake_at, now()) AS held_seconds,
       te.trigger_id
FROM runs r
LEFT JOIN trigger_events te ON te.run_id = r.run_id AND te.workspace_id = r.workspace_id
WHERE {{console_run_filter}}
  AND (r.created_at, r.run_id) > (:at_created::timestamptz, :at_run_id::uuid)
ORDER BY r.created_at, r.run_id
LIMIT :limit;

-- name: console_run_counts :many
-- How many of the filtered runs are in each status (the caller leaves the status filter out).
SELECT r.status, count(*) AS runs
FROM runs r
LEFT JOIN trigger_events te ON te.run_id = r.run_id AND te.workspace_id = r.workspace_id
WHERE {{console_run_filter}}
GROUP BY r.status;

-- name: console_queue_by_agent :many
-- A workspace's queue per agent: its cap, how many runs run, are queued (and due now), and
-- wait (console_waits counts the waits per reason), with the oldest queued run's age.
SELECT a.agent_id, a.max_concurrency AS agent_max_concurrency,
       count(r.run_id) FILTER (WHERE r.status = 'running') AS running,
       count(r.run_id) FILTER (WHERE r.status = 'queued') AS queued,
       count(r.run_id) FILTER (WHERE r.status = 'queued' AND r.wake_at <= now()) AS due,
       min(r.created_at) FILTER (WHERE r.status = 'queued') AS oldest_queued_at
FROM agents a
LEFT JOIN runs r ON r.workspace_id = a.workspace_id AND r.agent_id = a.agent_id
                AND r.status IN ('queued', 'running', 'waiting')
WHERE a.workspace_id = $1
GROUP BY a.agent_id, a.max_concurrency
ORDER BY a.agent_id;

-- name: console_waits :many
-- A workspace's waiting runs counted per agent and wait reason, with the earliest wake.
SELECT agent_id, wait_reason, count(*) AS runs, min(wake_at) AS next_wake_at
FROM runs
WHERE workspace_id = $1 AND status = 'waiting'
GROUP BY agent_id, wait_reason
ORDER BY agent_id, wait_reason;

-- name: console_release_waits :many
-- The runs of a workspace that wait pinned to a release (a turn handed back in progress, a
-- lapsed lease, a run moved there) while no executor of it was seen within $2 seconds:
-- nothing continues them until one returns or an operator moves them. At most 100. (The
-- releases seen are a CTE: Citus joins a coordinator-local table such as executor_tools
-- with a distributed one only through one.)
WITH seen AS MATERIALIZED (
    SELECT DISTINCT e.release FROM executor_tools e
    WHERE e.release IS NOT NULL AND e.last_seen > now() - make_interval(secs => $2)
)
SELECT r.run_id, r.agent_id, r.release, r.status, r.wait_reason, r.updated_at
FROM runs r
WHERE r.workspace_id = $1 AND r.release IS NOT NULL
  AND (r.status IN ('queued', 'waiting') OR (r.status = 'running' AND r.wake_at <= now()))
  AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.release = r.release)
ORDER BY r.updated_at, r.run_id
LIMIT 100;

-- name: console_awaiting_person :many
-- The unknown outcomes people must decide: for each run of the workspace waiting for a
-- person, its latest tool_result step marked awaiting 'human' that no decision refers to.
SELECT DISTINCT ON (r.run_id) r.run_id, r.agent_id, r.created_at, s.seq, s.payload::text
       AS payload, s.created_at AS step_created_at
FROM runs r
JOIN steps s ON s.workspace_id = r.workspace_id AND s.run_id = r.run_id
WHERE r.workspace_id = $1 AND r.status = 'waiting' AND r.wait_reason IN ('human', 'repeat')
  AND s.kind = 'tool_result' AND s.payload ->> 'awaiting' = 'human'
  AND NOT EXISTS (SELECT 1 FROM steps d
                  WHERE d.workspace_id = s.workspace_id AND d.run_id = s.run_id
                    AND d.ref_seq = s.seq AND d.payload ? 'decision')
ORDER BY r.run_id, s.seq DESC
LIMIT $2;

-- name: console_chart_started :many
-- The charts page: runs started per hour since :since (UTC hours), of one agent or all.
SELECT date_trunc('hour', created_at, 'UTC') AS at, count(*) AS started
FROM runs
WHERE workspace_id = :workspace_id AND created_at >= :since
  AND (:agent_id::text IS NULL OR agent_id = :agent_id)
GROUP BY 1;

-- name: console_chart_finished :many
-- The charts page: runs finished per hour since :since by how they ended, the p50 and p95
-- of their duration (admission to finish, seconds) and their tokens and cost.
SELECT date_trunc('hour', finished_at, 'UTC') AS at,
       count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) AS p95,
       sum(input_tokens + output_tokens)::bigint AS tokens,
       sum(cost_micros)::bigint AS cost_micros
FROM runs
WHERE workspace_id = :workspace_id AND finished_at >= :since
  AND (:agent_id::text IS NULL OR agent_id = :agent_id)
GROUP BY 1;

-- name: console_session_list :many
-- The sessions page: a workspace's sessions, most recently active first, those reader $3
-- may see (NULL: all; a private one only by its members, migration 0051).
SELECT session_id, agent_id, title, turn_count, strategy, created_at, updated_at
FROM sessions x WHERE workspace_id = $1
  AND ($3::text IS NULL OR visibility = 'workspace'
       OR EXISTS (SELECT 1 FROM session_members m
                  WHERE m.workspace_id = $1 AND m.session_id = x.session_id
                    AND m.member = $3))
ORDER BY updated_at DESC, session_id DESC
LIMIT $2;

-- name: console_session_turns :many
-- A session's turns, oldest first, each with its run's status, input, output and usage.
SELECT t.turn, t.run_id, t.created_at, t.ended_by, r.status, r.input, r.output, r.error,
       r.input_tokens, r.output_tokens, r.cost_micros
FROM session_turns t JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2
ORDER BY t.turn
LIMIT $3;

-- name: console_agent_versions :many
-- An agent's versions, newest first, with their specs (for a diff between two).
SELECT version, spec, created_at, tool_versions
FROM agent_versions WHERE workspace_id = $1 AND agent_id = $2
ORDER BY version DESC
LIMIT $3;

-- name: console_runs_by_release :many
-- The workspace's unfinished runs per release they are pinned to (NULL: none yet).
SELECT release, count(*) AS runs
FROM runs WHERE workspace_id = $1 AND status IN ('queued', 'running', 'waiting')
GROUP BY release;

-- name: console_chart_by_agent :many
-- The charts page's table: per agent since :since, runs started, and of those finished
-- since then how many completed and failed, their p95 duration (seconds), tokens and cost.
SELECT agent_id,
       count(*) FILTER (WHERE created_at >= :since) AS started,
       count(*) FILTER (WHERE finished_at >= :since AND status = 'completed') AS completed,
       count(*) FILTER (WHERE finished_at >= :since AND status = 'failed') AS failed,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))
           FILTER (WHERE finished_at >= :since) AS p95,
       coalesce(sum(input_tokens + output_tokens) FILTER (WHERE finished_at >= :since), 0)::bigint AS tokens,
       coalesce(sum(cost_micros) FILTER (WHERE finished_at >= :since), 0)::bigint AS cost_micros
FROM runs
WHERE workspace_id = :workspace_id AND (created_at >= :since OR finished_at >= :since)
GROUP BY agent_id
ORDER BY agent_id;
