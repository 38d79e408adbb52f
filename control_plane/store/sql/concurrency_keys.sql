-- name: run_key_position :one
-- A run waiting for a slot of its concurrency key (migrations/0050_concurrency_keys.sql):
-- how many of the key's waiters get a slot before it (highest priority, then oldest, as
-- run_key_release passes them on), and the key's slots held and limit.
SELECT (SELECT count(*) FROM runs x
        WHERE x.workspace_id = $1 AND x.agent_id = me.agent_id
          AND x.concurrency_key = me.concurrency_key
          AND x.status = 'waiting' AND x.wait_reason = 'concurrency_key'
          AND (x.priority, me.created_at, me.run_id) > (me.priority, x.created_at, x.run_id)
       ) AS runs_ahead,
       coalesce(k.held, 0) AS held, coalesce(k.slot_limit, 0) AS slot_limit
FROM runs me
LEFT JOIN concurrency_keys k
  ON k.workspace_id = $1 AND k.agent_id = me.agent_id AND k.key = me.concurrency_key
WHERE me.workspace_id = $1 AND me.run_id = $2
  AND me.status = 'waiting' AND me.wait_reason = 'concurrency_key';
