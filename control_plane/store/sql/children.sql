-- name: child_admit :one
-- Admit a start_child call's run (run_admit), in the transaction of the parent's park commit
-- (control_plane/runs/children.py, StartChild); child_mark then names its parent. A used request_id
-- (child:<parent>:<seq>) admits nothing.
WITH admit_if AS (SELECT), {{run_admit}}
SELECT run_id FROM admitted;

-- name: child_mark :exec
-- The child's parent and the seq of the call that started it (a new statement: the
-- admission's own cannot see the row it inserted).
UPDATE runs SET parent_run_id = $3, parent_seq = $4
WHERE workspace_id = $1 AND run_id = $2;

-- name: child_refused :exec
-- A child that could not be admitted: the call's error result in the parent's log, and the
-- parent woken (migrations/0013_child_runs.sql).
SELECT run_deliver_child_result($1::text, $2::uuid, $3::int, NULL, 'failed', NULL, $4::text);

-- name: runs_children :many
-- A run's child runs, in the order their calls were made.
SELECT run_id FROM runs
WHERE workspace_id = $1 AND parent_run_id = $2
ORDER BY parent_seq;
