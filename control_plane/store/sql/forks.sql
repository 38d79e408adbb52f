-- name: fork_source_steps :many
-- The source run's steps up to and including the fork point ($3), in order.
SELECT * FROM steps WHERE workspace_id = $1 AND run_id = $2 AND seq <= $3 ORDER BY seq;

-- name: fork_admit :one
-- Admit a fork (run_admit, the one admission shape; its input step is the source's seq 0),
-- copy the source's steps 1..:from_seq into its log as they are (kind, ref_seq, payload,
-- time and release; epoch 0, written at admission like the input step) and append the 'forked' marker
-- at :from_seq + 1, in one statement. fork_mark then counts them into step_count in the same
-- transaction (this statement cannot update the run row it inserts).
WITH admit_if AS (SELECT), {{run_admit}},
to_append AS (
    SELECT a.workspace_id, a.run_id, s.seq, s.kind, 0::bigint AS epoch, s.ref_seq, s.payload,
           s.created_at, s.release
    FROM admitted a
    -- (The source's steps named by :workspace_id: so Citus plans this on one shard.)
    JOIN steps s ON s.workspace_id = :workspace_id AND s.run_id = :source_run_id
    WHERE s.seq BETWEEN 1 AND :from_seq
    UNION ALL  -- the marker
    SELECT a.workspace_id, a.run_id, :from_seq + 1, 'forked', 0, NULL, :marker::jsonb, now(),
           NULL
    FROM admitted a
), {{steps_append}}
SELECT a.run_id, (SELECT count(*) FROM appended WHERE seq <= :from_seq) AS copied
FROM admitted a;

-- name: fork_mark :one
-- Name the fork's source and count its log: step_count is every step it holds, and the
-- counters are what the copied decisions and calls consumed (as the executor counts them,
-- executor/replay.py counters), so the limits copied at admission bound the whole log.
-- A fork of a session's run is the session's (migration 0053): a fork of a private turn
-- stays private.
UPDATE runs r SET
    forked_from_run_id = $3, forked_from_seq = $4,
    session_id = (SELECT s.session_id FROM runs s WHERE s.workspace_id = $1 AND s.run_id = $3),
    step_count = c.steps, model_calls = c.decisions, tool_calls = c.calls, tokens_used = c.tokens,
    refused_calls = c.refused
FROM (
    SELECT count(*) AS steps,
           count(*) FILTER (WHERE kind = 'model_decision') AS decisions,
           count(*) FILTER (WHERE kind = 'tool_started') AS calls,
           -- Calls a constraint refused (issue 48), as the commit counts them.
           count(*) FILTER (WHERE kind = 'tool_result'
                            AND coalesce(payload ->> 'refused_by', '') <> '') AS refused,
           coalesce(sum(coalesce((payload -> 'usage' ->> 'prompt_tokens')::bigint, 0)
                        + coalesce((payload -> 'usage' ->> 'completion_tokens')::bigint, 0))
                    FILTER (WHERE kind = 'model_decision'), 0) AS tokens
    FROM steps WHERE workspace_id = $1 AND run_id = $2
) c
WHERE r.workspace_id = $1 AND r.run_id = $2
RETURNING r.*, (SELECT run_held_seconds(r.held_since, r.wake_at, now())) AS held_seconds;

-- name: fork_list :many
-- A page of the forks of run $2, newest first, after a keyset cursor (as run_list), those
-- reader $8 may see (as run_list's $11).
SELECT *, run_held_seconds(held_since, wake_at, now()) AS held_seconds FROM runs
WHERE workspace_id = $1 AND forked_from_run_id = $2
  AND ($3::timestamptz IS NULL OR (created_at, run_id) < ($3, $4::uuid))
  AND ($5::text IS NULL OR agent_id = $5)
  AND ($6::text IS NULL OR status = $6)
  AND {{run_visible(runs, $1, $8)}}
ORDER BY created_at DESC, run_id DESC
LIMIT $7;
