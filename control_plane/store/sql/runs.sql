-- name: run_admit :fragment
-- The one shape of every admission (StartRun, trigger event, session turn; store/admission.py
-- decides the values): for each row of the including query's `admit_if` CTE (one, or none to
-- admit nothing), a queued run with its limits copied (deadline_seconds of active time,
-- max_age_seconds fixed as expires_at, 0 = none) and input_payload as its input step (seq 0;
-- its `text` is the run's input). A used request_id admits nothing. Database clock unless :now.
-- :priority orders it within its workspace's share (0026_run_priority.sql); :session_id names
-- a session turn's session (0053_run_session.sql; NULL for others); :key_rule a trigger's
-- concurrency_key rule, read instead of the version's (0054; NULL: the version's).
admitted AS (
    INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wake_at,
                      request_id, input, max_steps, max_tokens, max_tool_calls,
                      deadline_seconds, max_age_seconds, expires_at, model_retry_budget,
                      repeat_limit, context_tokens, started_by, step_count, created_at,
                      updated_at, priority, tags, metadata, session_id, key_rule)
    SELECT :workspace_id, :run_id, :agent_id, :agent_version, 'queued',
           coalesce(:now::timestamptz, now()), :request_id, :input_payload::jsonb ->> 'text',
           :max_steps, :max_tokens, :max_tool_calls, :deadline_seconds::int,
           :max_age_seconds::int,
           CASE WHEN :max_age_seconds::int > 0
               THEN coalesce(:now::timestamptz, now()) + make_interval(secs => :max_age_seconds::int)
           END,
           :model_retry_budget::int, :repeat_limit::int, :context_tokens::int, :started_by, 1,
           coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now()),
           :priority::smallint, coalesce(:tags::text[], '{}'),
           coalesce(:metadata::jsonb, '{}'), :session_id::uuid, :key_rule::jsonb
    FROM admit_if
    ON CONFLICT (workspace_id, agent_id, request_id) WHERE request_id IS NOT NULL DO NOTHING
    RETURNING *
), admitted_input AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT workspace_id, run_id, 0, 'input', 0, :input_payload::jsonb FROM admitted
)

-- name: run_insert :one
-- StartRun: admit a run and its input step in one statement (run_admit); returns nothing
-- when the request_id was used. Every query that returns a run returns the whole row and
-- held_seconds (store/runs.py Run).
WITH admit_if AS (SELECT), {{run_admit}}
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM admitted;

-- name: run_insert_latest :one
-- run_insert for a StartRun of the latest version, read from the replica's cache
-- (store/agents.py Versions): admits only while :agent_version is still the agent's
-- latest, checked in the insert's own snapshot. Nothing returned: the request_id was
-- used, or a newer version was published since; the caller reads it and asks again.
WITH admit_if AS (
    SELECT FROM agents
    WHERE workspace_id = :workspace_id AND agent_id = :agent_id
      AND latest_version = :agent_version
), {{run_admit}}
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM admitted;

-- name: run_get :one
-- One run of a workspace, with its current hold's seconds so far (held_seconds).
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds
FROM runs WHERE workspace_id = $1 AND run_id = $2;

-- name: run_get_by_request :one
-- The run a StartRun request_id created.
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds
FROM runs WHERE workspace_id = $1 AND agent_id = $2 AND request_id = $3;

-- name: run_list_filter :fragment
-- run_list's filters after the workspace: the keyset cursor ($2, $3), agent $4, status $5,
-- created since $7, text in id/agent/input/output/error $8, waiting since more than $9
-- seconds (a waiting run's updated_at is when it parked), metadata containing $10; only
-- the runs reader $11 may see (NULL: every run; control_plane/auth/privacy.py): none of a
-- private session it is not a member of (runs.session_id: a turn and all below it, 0053).
AND ($2::timestamptz IS NULL OR (created_at, run_id) < ($2, $3::uuid))
  AND ($4::text IS NULL OR agent_id = $4)
  AND ($5::text IS NULL OR status = $5)
  AND ($7::timestamptz IS NULL OR created_at >= $7)
  AND ($8::text IS NULL OR strpos(lower(run_id::text || ' ' || agent_id || ' ' || input
                                        || ' ' || coalesce(output, '') || ' ' || coalesce(error, '')),
                                  lower($8)) > 0)
  AND ($9::float8 IS NULL OR (status = 'waiting'
                              AND updated_at <= now() - make_interval(secs => $9::float8)))
  AND ($10::jsonb IS NULL OR metadata @> $10::jsonb)
  AND {{run_visible(runs, $1, $11)}}

-- name: run_list :many
-- A page of a workspace's runs, newest first, after a keyset cursor; optional
-- filters: agent, status, created since ($7), text in id/agent/input/output/error ($8),
-- waiting since more than $9 seconds (a waiting run's updated_at is when it parked: its
-- row is written again when it wakes, a release pin aside), metadata containing $10.
-- Database clock.
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM runs
WHERE workspace_id = $1
  {{run_list_filter}}
ORDER BY created_at DESC, run_id DESC
LIMIT $6;

-- name: run_list_tagged :many
-- run_list of the runs carrying tag $12, found through runs_by_tag (which holds only
-- tagged runs: `tags <> '{}'` lets the planner use it).
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM runs
WHERE workspace_id = $1
  AND tags <> '{}' AND tags @> ARRAY[$12::text]
  {{run_list_filter}}
ORDER BY created_at DESC, run_id DESC
LIMIT $6;

-- name: run_cancel :one
-- Cancel a non-terminal run at once. Its holder is fenced: the epoch check
-- of its next commit or heartbeat fails because status is no longer running.
-- Database clock unless $4 fixes it (a subquery: Citus refuses now() inside coalesce
-- in a write).
WITH cancelled AS (
    UPDATE runs SET status = 'cancelled', wait_reason = NULL, wake_at = NULL,
                    lease_owner = NULL, error = $3, step_count = step_count + 1,
                    finished_at = (SELECT coalesce($4::timestamptz, now())), updated_at = now()
    WHERE workspace_id = $1 AND run_id = $2
      AND status IN ('queued', 'running', 'waiting')
    RETURNING *
), to_append AS (  -- the finish step
    SELECT c.workspace_id, c.run_id, run_next_seq(c.workspace_id, c.run_id) AS seq,
           'finish' AS kind, c.lease_epoch AS epoch, NULL::int AS ref_seq,
           jsonb_build_object('status', 'cancelled', 'error', $3::text) AS payload,
           now() AS created_at, NULL::text AS release
    FROM cancelled c
), {{steps_append}}
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM cancelled;

-- name: runs_waiting_workspaces :many
-- Up to $1 workspaces with a run waiting for one of the kinds $2 since at least $3 seconds
-- (the smallest limit there can be). No lock (on Citus it reads every shard).
SELECT DISTINCT workspace_id FROM runs
WHERE status = 'waiting' AND wait_reason = ANY($2::text[])
  AND updated_at <= now() - make_interval(secs => $3::float8)
LIMIT $1;

-- name: run_fail_waited_too_long :many
-- Fail up to $3 of workspace $1's runs waiting longer than their kind's limit ($2: a JSON
-- object, wait kind -> seconds, positive ones only), each with a finish step saying which
-- limit. A waiting run's updated_at is when it parked. Database clock unless $4. The
-- error is written in `overdue` and the finish step's seq read in the statement: Citus
-- allows no stable function over columns in an UPDATE, nor a function reading a
-- distributed table on a shard (run_next_seq()).
WITH clock AS MATERIALIZED (
    SELECT (SELECT coalesce($4::timestamptz, now())) AS now
), overdue AS (
    SELECT r.workspace_id, r.run_id,
           format('waited for %s longer than the workspace allows (%s s)',
                  r.wait_reason, ($2::jsonb ->> r.wait_reason)::float8::bigint) AS error
    FROM runs r
    WHERE r.workspace_id = $1 AND r.status = 'waiting'
      AND r.updated_at <= (SELECT now FROM clock)
                          - make_interval(secs => ($2::jsonb ->> r.wait_reason)::float8)
    ORDER BY r.updated_at
    LIMIT $3
    FOR NO KEY UPDATE OF r SKIP LOCKED
), failed AS (
    UPDATE runs r SET status = 'failed', wait_reason = NULL, wake_at = NULL, lease_owner = NULL,
                      error = o.error,
                      step_count = r.step_count + 1, finished_at = (SELECT now FROM clock),
                      updated_at = now()
    FROM overdue o
    WHERE r.workspace_id = $1 AND r.workspace_id = o.workspace_id AND r.run_id = o.run_id
    RETURNING r.workspace_id, r.run_id, r.lease_epoch, r.error
), to_append AS (
    SELECT f.workspace_id, f.run_id,
           (SELECT coalesce(max(s.seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = $1 AND s.run_id = f.run_id) AS seq,
           'finish' AS kind, f.lease_epoch AS epoch, NULL::int AS ref_seq,
           jsonb_build_object('status', 'failed', 'error', f.error) AS payload,
           now() AS created_at, NULL::text AS release
    FROM failed f
), {{steps_append}}
SELECT workspace_id, run_id, error FROM failed;

-- name: runs_bulk_count :one
-- A bulk action's runs (control_plane/api/bulk.py): a workspace's runs a ListRuns filter
-- matches (run_list's filters: agent $2, status $3, created since $4, text $5, metadata
-- containment $6, tag $7), admitted at or before $8 (the action's start: runs admitted later,
-- its own forks among them, are not its own), only unfinished ones when $9, and only those
-- reader $10 may see (NULL: all; control_plane/auth/privacy.py): a hidden run is no match.
SELECT count(*) AS n FROM runs
WHERE workspace_id = $1 AND (NOT $9::boolean OR status IN ('queued', 'running', 'waiting'))
  AND created_at <= $8
  AND ($2::text IS NULL OR agent_id = $2)
  AND ($3::text IS NULL OR status = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::text IS NULL OR strpos(lower(run_id::text || ' ' || agent_id || ' ' || input
                                        || ' ' || coalesce(output, '') || ' ' || coalesce(error, '')),
                                  lower($5)) > 0)
  AND ($6::jsonb IS NULL OR metadata @> $6::jsonb)
  AND ($7::text IS NULL OR (tags <> '{}' AND tags @> ARRAY[$7::text]))
  AND {{run_visible(runs, $1, $10)}};

-- name: runs_bulk_batch :many
-- runs_bulk_count's next $13 runs, oldest first, after the keyset cursor ($11, $12).
SELECT run_id, created_at FROM runs
WHERE workspace_id = $1 AND (NOT $9::boolean OR status IN ('queued', 'running', 'waiting'))
  AND created_at <= $8
  AND ($11::timestamptz IS NULL OR (created_at, run_id) > ($11, $12::uuid))
  AND ($2::text IS NULL OR agent_id = $2)
  AND ($3::text IS NULL OR status = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::text IS NULL OR strpos(lower(run_id::text || ' ' || agent_id || ' ' || input
                                        || ' ' || coalesce(output, '') || ' ' || coalesce(error, '')),
                                  lower($5)) > 0)
  AND ($6::jsonb IS NULL OR metadata @> $6::jsonb)
  AND ($7::text IS NULL OR (tags <> '{}' AND tags @> ARRAY[$7::text]))
  AND {{run_visible(runs, $1, $10)}}
ORDER BY created_at, run_id
LIMIT $13;
