-- name: steps_append :fragment
-- The one shape of every append to a run's log by a named query (the database's own appends,
-- a child's result and a signal's delivery, go through run_deliver_result of
-- migrations/0036_step_appends.sql; admission's input step is run_admit's own, as a fragment
-- cannot include another): the rows of the including statement's `to_append` CTE
-- (workspace_id, run_id, seq, kind, epoch, ref_seq, payload, created_at, release: the
-- release that wrote it, NULL for the database's own steps) inserted as they
-- are; a step where the log ends takes seq run_next_seq(workspace_id, run_id), under the
-- run row's lock. `appended` returns each step's workspace_id, run_id and seq: the statement
-- counts them into runs.step_count itself (0011: no trigger does). Unique (workspace_id,
-- run_id, seq) is every writer's backstop.
appended AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload, created_at,
                       release)
    SELECT workspace_id, run_id, seq, kind, epoch, ref_seq, payload, created_at, release
    FROM to_append
    RETURNING workspace_id, run_id, seq
)

-- name: run_commit :one
-- The fenced commit, in one statement: lock the run row, check it is still
-- running under this epoch, append the steps, count them and bump the other
-- counters (refused_calls: the calls a constraint refused in these steps, issue 48,
-- counted by the caller from the payloads), and either keep the lease (:status NULL) or
-- apply the transition (:status = 'waiting', 'completed', 'failed'; parking and
-- finishing release the lease, and the runs_active_time trigger adds the
-- hold's time). Zero rows means fenced; unique (run_id, seq) is the backstop.
-- Keeping the lease renews it only when it must ("Renewing on commit" in
-- lease.sql): always with :renew_always (an executor that counts every commit
-- as a renewal), else only once half of it or less is left, so that most
-- commits leave wake_at (indexed) alone and the update stays HOT. `renewed`
-- says which. Database clock unless :now fixes it. A commit without a transition
-- goes through run_commit_keep (below), this statement narrowed to the case
-- where nothing is renewed, and comes here when that finds the renewal due.
WITH locked AS (
    SELECT workspace_id, run_id, release,
           :status::text IS NULL AND (:renew_always::boolean OR wake_at IS NULL
               OR wake_at <= (SELECT coalesce(:now::timestamptz, now())
                                     + make_interval(secs => 0.5 * :lease_seconds::float8)))
               AS renews,
           -- The times the CASEs below pick from, as columns (Citus plans no clock in a CASE).
           (SELECT coalesce(:now::timestamptz, now())) AS now,
           (SELECT coalesce(:now::timestamptz, now())
                   + make_interval(secs => :lease_seconds::float8)) AS renewed_until,
           (SELECT coalesce(:wake_at::timestamptz, coalesce(:now::timestamptz, now())
                   + make_interval(secs => :wake_after_seconds::float8))) AS parked_until
    FROM runs
    WHERE workspace_id = :workspace_id AND run_id = :run_id AND lease_epoch = :epoch
      AND status = 'running'
    FOR NO KEY UPDATE
), to_append AS (
    SELECT l.workspace_id, l.run_id, s.seq, s.kind, :epoch::bigint AS epoch, s.ref_seq,
           s.payload, now() AS created_at, l.release
    FROM locked l,
         unnest(:seqs::int[], :kinds::text[], :ref_seqs::int[], :payloads::jsonb[])
             AS s(seq, kind, ref_seq, payload)
), {{steps_append}}
UPDATE runs r SET
    step_count = r.step_count + (SELECT count(*) FROM appended),
    model_calls = r.model_calls + :model_calls,
    tool_calls = r.tool_calls + :tool_calls,
    refused_calls = r.refused_calls + :refused_calls,
    tokens_used = r.tokens_used + :tokens,
    -- Usage and cost priced from the steps (control_plane/pricing.py), in this statement.
    input_tokens = r.input_tokens + :input_tokens,
    output_tokens = r.output_tokens + :output_tokens,
    cached_tokens = r.cached_tokens + :cached_tokens,
    reasoning_tokens = r.reasoning_tokens + :reasoning_tokens,
    cost_micros = r.cost_micros + :cost_micros,
    status = coalesce(:status, r.status),
    wait_reason = CASE WHEN :status = 'waiting' THEN :wait_reason END,
    waiting_connection_id = CASE WHEN :status = 'waiting' THEN :waiting_connection_id::uuid END,
    -- A park between turns leaves the run on no release: it continues on the newest.
    release = CASE WHEN :status = 'waiting' AND :between_turns::boolean THEN NULL
                   ELSE r.release END,
    wake_at = CASE
        WHEN locked.renews THEN locked.renewed_until
        WHEN :status IS NULL THEN r.wake_at
        WHEN :status = 'waiting' THEN locked.parked_until
    END,
    lease_owner = CASE WHEN :status IS NULL THEN r.lease_owner END,
    output = CASE WHEN :status = 'completed' THEN :text END,
    error = CASE WHEN :status = 'failed' THEN :text END,
    finished_at = CASE WHEN :status IN ('completed', 'failed') THEN locked.now END,
    updated_at = now()
FROM locked
WHERE r.workspace_id = :workspace_id
  AND r.workspace_id = locked.workspace_id AND r.run_id = locked.run_id
-- credits_due: a metered run that spent all it reserved tops up before its next step.
RETURNING r.status, r.wake_at, locked.renews AS renewed,
    r.credit_chunks > 0 AND r.cost_micros >= r.credits_reserved_micros AS credits_due,
    r.refused_calls, r.tool_calls;

-- name: run_commit_keep :one
-- run_commit for the common case, a commit that keeps the lease as it is: no
-- transition, and more than half of the lease left (run_commit's renewal rule,
-- negated, in the fence), so nothing to renew. The same fence, steps and
-- counters, and the same row afterwards (status, lease_owner and wake_at stay
-- as they are; the columns run_commit's CASEs clear are cleared). Its SET list
-- names neither status nor wake_at, so Postgres does not even consider the row
-- triggers that watch them (AFTER UPDATE OF status; 0035's runs_active_time and
-- runs_fair_update, UPDATE OF status and wake_at), whose WHEN clauses it would
-- otherwise prepare for the statement; it binds seven parameters fewer and
-- counts the steps it was given rather than those it inserted (the insert lands
-- every step or fails the statement). Zero rows: fenced, or due for renewal;
-- the caller then commits through run_commit, which renews or fences.
-- Database clock unless :now fixes it.
WITH locked AS (
    SELECT workspace_id, run_id, release
    FROM runs
    WHERE workspace_id = :workspace_id AND run_id = :run_id AND lease_epoch = :epoch
      AND status = 'running'
      AND wake_at > (SELECT coalesce(:now::timestamptz, now())
                            + make_interval(secs => 0.5 * :lease_seconds::float8))
    FOR NO KEY UPDATE
), to_append AS (
    SELECT l.workspace_id, l.run_id, s.seq, s.kind, :epoch::bigint AS epoch, s.ref_seq,
           s.payload, now() AS created_at, l.release
    FROM locked l,
         unnest(:seqs::int[], :kinds::text[], :ref_seqs::int[], :payloads::jsonb[])
             AS s(seq, kind, ref_seq, payload)
), {{steps_append}}
UPDATE runs r SET
    step_count = r.step_count + cardinality(:seqs::int[]),
    model_calls = r.model_calls + :model_calls,
    tool_calls = r.tool_calls + :tool_calls,
    refused_calls = r.refused_calls + :refused_calls,
    tokens_used = r.tokens_used + :tokens,
    input_tokens = r.input_tokens + :input_tokens,
    output_tokens = r.output_tokens + :output_tokens,
    cached_tokens = r.cached_tokens + :cached_tokens,
    reasoning_tokens = r.reasoning_tokens + :reasoning_tokens,
    cost_micros = r.cost_micros + :cost_micros,
    wait_reason = NULL,
    waiting_connection_id = NULL,
    output = NULL,
    error = NULL,
    finished_at = NULL,
    updated_at = now()
FROM locked
WHERE r.workspace_id = :workspace_id
  AND r.workspace_id = locked.workspace_id AND r.run_id = locked.run_id
RETURNING r.status, r.wake_at, false AS renewed,
    r.credit_chunks > 0 AND r.cost_micros >= r.credits_reserved_micros AS credits_due,
    r.refused_calls, r.tool_calls;

-- name: steps_by_seqs :many
-- Which of these seqs exist, under which epoch (recognises a retried commit).
SELECT seq, epoch, kind FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND seq = ANY($3::int[]);

-- name: steps_list :many
-- A run's steps in order from a seq.
SELECT * FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND seq >= $3
ORDER BY seq
LIMIT $4;

-- name: steps_for_runs :many
-- The whole step logs of several runs (for assignments).
SELECT s.* FROM steps s
JOIN unnest($1::text[], $2::uuid[]) AS r(workspace_id, run_id)
  ON s.workspace_id = r.workspace_id AND s.run_id = r.run_id
ORDER BY s.run_id, s.seq;

-- name: steps_seen_values :many
-- The values one argument of one tool took in the workspace's earlier calls whose result
-- was ok (issue 48: a VALUE_ALLOWED rule's "seen before", e.g. payees paid before), at
-- most $4 of them. Routed by the workspace; read when a run with such a rule is assigned.
SELECT DISTINCT started.payload->'arguments'->>$3 AS value
FROM steps started
JOIN steps result
  ON result.workspace_id = started.workspace_id AND result.run_id = started.run_id
 AND result.ref_seq = started.seq AND result.kind = 'tool_result'
WHERE started.workspace_id = $1 AND result.workspace_id = $1
  AND started.kind = 'tool_started' AND started.payload->>'tool' = $2
  AND result.payload->>'status' = 'ok'
  AND started.payload->'arguments'->>$3 IS NOT NULL
LIMIT $4;

-- name: run_commit_many :many
-- run_commit for several runs of one workspace in one statement
-- (control_plane/dispatch/commits.py groups the commits that arrive in one event-loop
-- tick by workspace): one round trip and one transaction, so one WAL flush, for all of
-- them, and on Citus one shard (the workspace's). Each run is fenced on its own: a
-- run not running under its epoch is left out of `locked`, its steps are not
-- appended and it returns no row, while the others commit; the caller settles it
-- alone (a retried duplicate, or fenced) as run_commit's caller does. One run at
-- most once per call (two updates of one row in a statement would not both apply).
-- Rows are locked in run_id order, so two of these that share runs wait rather than
-- deadlock. Any error (a unique violation of a retried commit, a refused payload)
-- fails the whole statement; the caller then commits each alone. Steps are tied to
-- their run by `:step_runs`, the index of the run in the arrays. Database clock.
-- Columns, and when the lease is renewed, as in run_commit; the times the CASEs pick
-- are columns of `locked`, as there. Each run's step count grows by the steps it was
-- given (:step_counts), as run_commit_keep counts: the insert lands every step or fails
-- the statement.
WITH locked AS (
    -- Only the runs' own columns and each one's index in the arrays (i): the requests'
    -- values are read from the arrays by it where they are used. On Citus the CTEs of
    -- a writing statement are intermediate results, and one holding values unnested
    -- from parameters is not read back ("PGCOPY"); this shape is.
    SELECT r.workspace_id, r.run_id, r.lease_epoch AS epoch, r.release, x.i,
           (SELECT now()) AS now,
           (SELECT now() + make_interval(secs => :lease_seconds::float8)) AS renewed_until,
           (:statuses::text[])[x.i] IS NULL
               AND ((:renew_always::boolean[])[x.i] OR r.wake_at IS NULL
                    OR r.wake_at <= (SELECT now() + make_interval(secs => 0.5 * :lease_seconds::float8)))
               AS renews,
           (SELECT coalesce((:wake_ats::timestamptz[])[x.i],
                            now() + make_interval(secs => (:wake_after_seconds::float8[])[x.i])))
               AS parked_until
    FROM runs r
    CROSS JOIN LATERAL (SELECT array_position(:run_ids::uuid[], r.run_id) AS i) x
    WHERE r.workspace_id = :workspace_id AND r.run_id = ANY(:run_ids::uuid[])
      AND r.lease_epoch = (:epochs::bigint[])[x.i] AND r.status = 'running'
    ORDER BY r.run_id
    FOR NO KEY UPDATE OF r
), to_append AS (
    SELECT l.workspace_id, l.run_id, s.seq, s.kind, l.epoch, s.ref_seq, s.payload,
           now() AS created_at, l.release
    FROM locked l, unnest(:step_runs::bigint[], :seqs::int[], :kinds::text[], :ref_seqs::int[],
                          :payloads::jsonb[]) AS s(i, seq, kind, ref_seq, payload)
    WHERE s.i = l.i
), {{steps_append}}
UPDATE runs r SET
    step_count = r.step_count + (:step_counts::int[])[l.i],
    model_calls = r.model_calls + (:model_calls::int[])[l.i],
    tool_calls = r.tool_calls + (:tool_calls::int[])[l.i],
    refused_calls = r.refused_calls + (:refused_calls::int[])[l.i],
    tokens_used = r.tokens_used + (:tokens::bigint[])[l.i],
    input_tokens = r.input_tokens + (:input_tokens::bigint[])[l.i],
    output_tokens = r.output_tokens + (:output_tokens::bigint[])[l.i],
    cached_tokens = r.cached_tokens + (:cached_tokens::bigint[])[l.i],
    reasoning_tokens = r.reasoning_tokens + (:reasoning_tokens::bigint[])[l.i],
    cost_micros = r.cost_micros + (:cost_micros::bigint[])[l.i],
    status = coalesce((:statuses::text[])[l.i], r.status),
    wait_reason = CASE WHEN (:statuses::text[])[l.i] = 'waiting'
                       THEN (:wait_reasons::text[])[l.i] END,
    waiting_connection_id = CASE WHEN (:statuses::text[])[l.i] = 'waiting'
                                 THEN (:waiting_connection_ids::uuid[])[l.i] END,
    release = CASE WHEN (:statuses::text[])[l.i] = 'waiting'
                        AND (:between_turns::boolean[])[l.i] THEN NULL
                   ELSE r.release END,
    wake_at = CASE
        WHEN l.renews THEN l.renewed_until
        WHEN (:statuses::text[])[l.i] IS NULL THEN r.wake_at
        WHEN (:statuses::text[])[l.i] = 'waiting' THEN l.parked_until
    END,
    lease_owner = CASE WHEN (:statuses::text[])[l.i] IS NULL THEN r.lease_owner END,
    output = CASE WHEN (:statuses::text[])[l.i] = 'completed' THEN (:texts::text[])[l.i] END,
    error = CASE WHEN (:statuses::text[])[l.i] = 'failed' THEN (:texts::text[])[l.i] END,
    finished_at = CASE WHEN (:statuses::text[])[l.i] IN ('completed', 'failed') THEN l.now END,
    -- The clock of `locked`, as the lease's end: on Citus now() here is the worker's.
    updated_at = l.now
FROM locked l
WHERE r.workspace_id = :workspace_id AND r.run_id = l.run_id
RETURNING l.i, r.status, r.wake_at, l.renews AS renewed,
    r.credit_chunks > 0 AND r.cost_micros >= r.credits_reserved_micros AS credits_due,
    r.refused_calls, r.tool_calls;
