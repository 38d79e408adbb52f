-- name: event_lock_publish :exec
-- A publish of event name $2 in workspace $1 excludes the parks on that name until its
-- transaction ends (migrations/0049_events.sql says why: no wake is lost between them).
SELECT pg_advisory_xact_lock(hashtextextended('agentrun.event:' || $1::text || ':' || $2::text, 0));

-- name: event_lock_park :exec
-- A park on event name $2 in workspace $1 excludes publishes of that name (not other parks).
SELECT pg_advisory_xact_lock_shared(
    hashtextextended('agentrun.event:' || $1::text || ':' || $2::text, 0));

-- name: event_insert :one
-- Store a published event; nothing (NULL) when its id was used already.
INSERT INTO events (workspace_id, event_id, name, body, body_sha256, published_by)
VALUES ($1, $2, $3, $4::jsonb, $5, $6)
ON CONFLICT (workspace_id, event_id) DO NOTHING
RETURNING *;

-- name: event_get :one
-- One event of a workspace by its id.
SELECT * FROM events WHERE workspace_id = $1 AND event_id = $2;

-- name: event_counted :exec
-- How many waits the event answered and runs it cancelled.
UPDATE events SET woke = $3, cancelled = $4 WHERE workspace_id = $1 AND event_id = $2;

-- name: event_shapes_of :many
-- The shapes that waits on event name $2 use (a handful: one per distinct set of paths).
SELECT shape FROM event_shapes WHERE workspace_id = $1 AND event_name = $2;

-- name: event_shape_add :exec
-- Record a shape in use (a second wait of the same shape finds it there).
INSERT INTO event_shapes (workspace_id, event_name, shape) VALUES ($1, $2, $3::jsonb)
ON CONFLICT DO NOTHING;

-- name: event_waits_matching :many
-- The parked waits whose key is one of the event's projections $3 (an index lookup on
-- event_waits_by_key), in run order: deliveries lock runs in one order.
SELECT run_id, call_seq, slot FROM event_waits
WHERE workspace_id = $1 AND event_name = $2 AND match_key = ANY($3::jsonb[])
ORDER BY run_id, call_seq, slot;

-- name: event_wait_add :exec
-- One slot of a parked wait_for_event call.
INSERT INTO event_waits (workspace_id, run_id, call_seq, slot, event_name, match_key)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
ON CONFLICT DO NOTHING;

-- name: event_deliver :one
-- Fill a slot of a parked call with an event; the result's seq when that ends the wait
-- (run_deliver_event, migrations/0049_events.sql), else NULL.
SELECT run_deliver_event($1::text, $2::uuid, $3::integer, $4::integer, $5::text) AS result_seq;

-- name: event_call_started :one
-- When the wait_for_event call at seq $3 started (its look-back counts from there).
SELECT created_at FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND seq = $3 AND kind = 'tool_started';

-- name: event_lookback :many
-- Events of name $3 published since $4 whose body contains $5, which run $2 has not
-- received yet, oldest first (the caller checks each against the key).
SELECT e.event_id, e.body FROM events e
WHERE e.workspace_id = $1 AND e.name = $3 AND e.published_at >= $4::timestamptz
  AND e.body @> $5::jsonb
  AND NOT EXISTS (SELECT 1 FROM event_deliveries d
                  WHERE d.workspace_id = $1 AND d.run_id = $2 AND d.event_id = e.event_id)
ORDER BY e.published_at, e.event_id
LIMIT 100;

-- name: event_cancel_rules :many
-- The agent versions of workspace $1 that declare a cancel_on for event name $2.
SELECT agent_id, version, spec -> 'cancel_on' AS cancel_on FROM agent_versions
WHERE workspace_id = $1
  AND spec -> 'cancel_on' @> jsonb_build_array(jsonb_build_object('event', $2::text));

-- name: event_cancel_targets :many
-- The unfinished runs of agent $2 version $3 whose input (as JSON) contains $4.
SELECT run_id FROM runs
WHERE workspace_id = $1 AND agent_id = $2 AND agent_version = $3
  AND status IN ('queued', 'running', 'waiting')
  AND agentrun_input_json(input) @> $4::jsonb
ORDER BY run_id;
