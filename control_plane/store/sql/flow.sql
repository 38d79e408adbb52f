-- name: flow_event_hold :one
-- Record a pending event of a debounced or batched trigger and count it in its group, in one
-- statement; a redelivery (same dedupe key) inserts and counts nothing and returns nothing.
-- A debounce is due :quiet_seconds after its newest event; a batch :max_seconds after its
-- group opened, or now once it holds :max_events. Database clock unless :now.
WITH event AS (
    INSERT INTO trigger_events (workspace_id, event_id, trigger_id, dedupe_key, status,
                                payload, flow_key, flow_seq, received_at)
    VALUES (:workspace_id, :event_id, :trigger_id, :dedupe_key, 'pending',
            :event_payload::jsonb, :flow_key, nextval('trigger_flow_seq'),
            coalesce(:now::timestamptz, now()))
    ON CONFLICT (workspace_id, trigger_id, dedupe_key) DO NOTHING
    RETURNING *
), counted AS (
    INSERT INTO trigger_flow_groups AS g (workspace_id, trigger_id, flow_key, mode, pending,
                                          opened_at, due_at)
    SELECT workspace_id, trigger_id, flow_key, :mode, 1, received_at,
           received_at + make_interval(secs => :wait_seconds::int)
    FROM event
    ON CONFLICT (workspace_id, trigger_id, flow_key) DO UPDATE SET
        pending = g.pending + 1,
        due_at = CASE
            WHEN g.mode = 'debounce' THEN EXCLUDED.due_at
            WHEN g.pending + 1 >= :max_events::int THEN least(g.due_at, EXCLUDED.opened_at)
            ELSE g.due_at END
)
SELECT * FROM event;

-- name: flow_due_workspaces :many
-- Up to $2 workspaces with a group whose time has come, the longest overdue first. No
-- lock: on Citus this reads every shard, which a locking read may not. Database clock
-- unless $1.
SELECT g.workspace_id
FROM trigger_flow_groups g JOIN triggers t USING (workspace_id, trigger_id)
WHERE g.due_at <= coalesce($1::timestamptz, now()) AND t.enabled
GROUP BY g.workspace_id
ORDER BY min(g.due_at)
LIMIT $2;

-- name: flow_claim_due :many
-- Lock up to $2 of workspace $3's groups whose time has come, skipping those another
-- replica holds, until the caller's transaction commits their flush (one workspace: one
-- shard on Citus). Database clock unless $1.
SELECT g.*, t.agent_id, t.kind, t.scheme, t.config, t.filters, t.enabled,
       coalesce($1::timestamptz, now()) AS db_now
FROM trigger_flow_groups g JOIN triggers t USING (workspace_id, trigger_id)
WHERE g.workspace_id = $3 AND t.workspace_id = $3
  AND g.due_at <= coalesce($1::timestamptz, now()) AND t.enabled
ORDER BY g.due_at
LIMIT $2
FOR UPDATE OF g SKIP LOCKED;

-- name: flow_take :many
-- A group's first $4 pending events in arrival order, locked.
SELECT * FROM trigger_events
WHERE workspace_id = $1 AND trigger_id = $2 AND flow_key = $3 AND status = 'pending'
ORDER BY flow_seq
LIMIT $4
FOR UPDATE;

-- name: flow_consume :one
-- Admit the run (run_admit) and mark the events it holds accepted with it, in one statement;
-- only events still pending are taken, so a flush that somehow ran twice admits nothing the
-- second time (and its request_id, the group and first event, would refuse a second run).
WITH consumed AS (
    UPDATE trigger_events SET status = 'accepted', run_id = :run_id::uuid
    WHERE workspace_id = :workspace_id AND event_id = ANY(:event_ids::uuid[])
      AND status = 'pending'
    RETURNING event_id
), admit_if AS (
    SELECT FROM (SELECT count(*) AS n FROM consumed) c WHERE n > 0
), {{run_admit}}
SELECT (SELECT count(*) FROM consumed) AS consumed;

-- name: flow_group_settle :exec
-- After a flush: forget a group with no pending event left, else count what is left and
-- make it due now (a full batch) or after another wait ($5 seconds; debounce: quiet period).
WITH left_over AS (
    SELECT count(*) AS n FROM trigger_events
    WHERE workspace_id = $1 AND trigger_id = $2 AND flow_key = $3 AND status = 'pending'
), forgotten AS (
    DELETE FROM trigger_flow_groups
    WHERE workspace_id = $1 AND trigger_id = $2 AND flow_key = $3
      AND (SELECT n FROM left_over) = 0
)
-- (The clock as a subquery: Citus refuses now() inside coalesce or CASE in a write.)
UPDATE trigger_flow_groups SET
    pending = (SELECT n FROM left_over),
    opened_at = (SELECT coalesce($6::timestamptz, now())),
    due_at = (SELECT coalesce($6::timestamptz, now()))
             + CASE WHEN (SELECT n FROM left_over) >= $4 THEN interval '0'
                    ELSE make_interval(secs => $5::int) END
WHERE workspace_id = $1 AND trigger_id = $2 AND flow_key = $3
  AND (SELECT n FROM left_over) > 0;
