-- name: executor_tools_upsert :exec
-- Record what a (re)connected executor carries, under its new stream.
INSERT INTO executor_tools (executor_id, session_id, release, scope, tools)
VALUES ($1, $2, $3, $4, $5::jsonb)
ON CONFLICT (executor_id) DO UPDATE
SET session_id = excluded.session_id, release = excluded.release, scope = excluded.scope,
    tools = excluded.tools, connected_at = now(), last_seen = now();

-- name: executor_tools_touch :exec
-- Mark the executors of these streams ($1 session ids) as still connected.
UPDATE executor_tools SET last_seen = now() WHERE session_id = ANY($1::text[]);

-- name: executor_tools_forget :exec
-- A stream ended: its executor no longer counts (unless it reconnected since, under a
-- new session). By session, so every executor id the stream's Hellos named goes.
DELETE FROM executor_tools WHERE session_id = $1;

-- name: executor_tools_live_for :many
-- The tool sets of executors seen within the last $2 seconds that may serve
-- workspace $1 (their scope names it, or they serve every workspace).
SELECT executor_id, tools FROM executor_tools
WHERE last_seen > now() - make_interval(secs => $2)
  AND (scope IS NULL OR $1 = ANY(scope))
ORDER BY executor_id;
