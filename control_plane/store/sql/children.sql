-- name: child_admit :one
-- Admit a start_child call's run (run_admit), in the transaction of the parent's park commit
-- (control_plane/runs/children.py, StartChild); child_mark then names its parent. A used request_id
-- (child:<parent>:<seq>) admits nothing.
WITH admit_if AS (SELECT), {{run_admit}}
SELECT run_id FROM admitted;

-- name: child_mark :exec
-- The child's parent, the seq of the call that started it, its place in a start_children
-- list ($5, NULL for start_child) and what the parent's close does to it ($6: cancel,
-- abandon, finish; migrations/0048_fan_out.sql). A new statement: the admission's own
-- cannot see the row it inserted. A child of a session's run is the session's too
-- (migration 0053), however deep.
UPDATE runs SET parent_run_id = $3, parent_seq = $4, parent_index = $5, parent_close = $6,
                session_id = (SELECT p.session_id FROM runs p
                              WHERE p.workspace_id = $1 AND p.run_id = $3)
WHERE workspace_id = $1 AND run_id = $2;

-- name: child_parent_closes :exec
-- The parent has a child its close cancels: its terminal transition runs the trigger
-- runs_close_children (a run that never marks this pays nothing for it).
UPDATE runs SET closes_children = true
WHERE workspace_id = $1 AND run_id = $2 AND NOT closes_children;

-- name: fan_refused :exec
-- A start_children call that admitted nothing: its error result in the parent's log, and
-- the parent woken (migrations/0048_fan_out.sql).
SELECT run_deliver_fan_refused($1::text, $2::uuid, $3::int, $4::text);

-- name: child_refused :exec
-- A child that could not be admitted: the call's error result in the parent's log, and the
-- parent woken (migrations/0013_child_runs.sql).
SELECT run_deliver_child_result($1::text, $2::uuid, $3::int, NULL, 'failed', NULL, $4::text);

-- name: runs_children :many
-- A run's child runs, in the order their calls were made (a list's in its order).
SELECT run_id FROM runs
WHERE workspace_id = $1 AND parent_run_id = $2
ORDER BY parent_seq, parent_index;

-- name: children_closed_with :many
-- The runs cancelled with a run that closes its children (migrations/0048_fan_out.sql:
-- its open children whose policy is cancel, theirs, and so on), to tell their holders.
WITH RECURSIVE closed AS (
    SELECT run_id, closes_children FROM runs
    WHERE workspace_id = $1 AND parent_run_id = $2 AND parent_close = 'cancel'
      AND status = 'cancelled'
    UNION ALL
    SELECT r.run_id, r.closes_children FROM runs r JOIN closed c ON r.parent_run_id = c.run_id
    WHERE r.workspace_id = $1 AND c.closes_children AND r.parent_close = 'cancel'
      AND r.status = 'cancelled'
)
SELECT run_id FROM closed;
