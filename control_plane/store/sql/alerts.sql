-- name: alert_insert :one
-- A new alert rule; no row when the name is taken. (The insert in a CTE and the channel's
-- name read outside it: Citus plans no subquery in an INSERT.)
WITH added AS (
    INSERT INTO alert_rules (workspace_id, name, channel_id, recipient, kind, agent_id,
                             window_seconds, min_finished, threshold, waiting_seconds)
    VALUES (:workspace_id, :rule_name, :channel_id, :recipient, :kind, :agent_id,
            :window_seconds, :min_finished, :threshold, :waiting_seconds)
    ON CONFLICT (workspace_id, name) DO NOTHING
    RETURNING *
)
SELECT a.*, (SELECT c.name FROM channels c WHERE c.workspace_id = :workspace_id
                                            AND c.channel_id = :channel_id) AS channel_name
FROM added a;

-- name: alert_list :many
-- A workspace's alert rules, by name, with their channel's name.
SELECT a.*, c.name AS channel_name FROM alert_rules a
JOIN channels c ON c.workspace_id = a.workspace_id AND c.channel_id = a.channel_id
WHERE a.workspace_id = :workspace_id
ORDER BY a.name;

-- name: alert_delete :one
-- Remove an alert rule by name; its name, or no row.
DELETE FROM alert_rules WHERE workspace_id = :workspace_id AND name = :rule_name RETURNING name;

-- name: alert_evaluate :many
-- Up to :limit alert rules of any workspace, each with what it sees now (database clock)
-- and whether it is breached: failure_rate, at least min_finished runs (at least one)
-- finished in the window and at least threshold of them failed; stuck_on_person, a run
-- waiting on a person (approval, question, unknown outcome) longer than waiting_seconds (a
-- waiting run's updated_at is when it parked). No lock (on Citus it reads every shard).
SELECT a.workspace_id, a.name, a.kind, a.agent_id, a.channel_id, a.recipient,
       a.window_seconds, a.min_finished, a.threshold, a.waiting_seconds,
       a.fired_at, a.resolved_at, a.fire_count, c.kind AS channel_kind,
       coalesce(f.finished, 0) AS finished, coalesce(f.failed, 0) AS failed,
       coalesce(s.stuck, 0) AS stuck, s.oldest,
       CASE WHEN a.kind = 'failure_rate'
            THEN coalesce(f.finished, 0) >= greatest(a.min_finished, 1)
                 AND coalesce(f.failed, 0) >= a.threshold * f.finished
            ELSE coalesce(s.stuck, 0) > 0 END AS breached
FROM alert_rules a
JOIN channels c ON c.workspace_id = a.workspace_id AND c.channel_id = a.channel_id
LEFT JOIN LATERAL (
    SELECT count(*) AS finished, count(*) FILTER (WHERE r.status = 'failed') AS failed
    FROM runs r
    WHERE a.kind = 'failure_rate' AND r.workspace_id = a.workspace_id
      AND r.finished_at > now() - make_interval(secs => a.window_seconds)
      AND (a.agent_id IS NULL OR r.agent_id = a.agent_id)
) f ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS stuck, min(r.updated_at) AS oldest FROM runs r
    WHERE a.kind = 'stuck_on_person' AND r.workspace_id = a.workspace_id
      AND r.status = 'waiting' AND r.wait_reason IN ('approval', 'human', 'repeat')
      AND r.updated_at <= now() - make_interval(secs => a.waiting_seconds)
      AND (a.agent_id IS NULL OR r.agent_id = a.agent_id)
) s ON true
ORDER BY a.workspace_id, a.name
LIMIT :limit;

-- name: alert_fire :one
-- The rule is breached: fire, unless it already fired for this breach (fired and not
-- resolved since). One guarded update, so two replicas fire it once; the caller queues the
-- notification in the same transaction. The new fire_count, or no row.
UPDATE alert_rules SET fired_at = now(), resolved_at = NULL, fire_count = fire_count + 1
WHERE workspace_id = :workspace_id AND name = :rule_name
  AND (fired_at IS NULL OR resolved_at IS NOT NULL)
RETURNING fire_count, fired_at;

-- name: alert_resolve :one
-- The rule is no longer breached: the breach it fired for is over (the next one fires).
UPDATE alert_rules SET resolved_at = now()
WHERE workspace_id = :workspace_id AND name = :rule_name
  AND fired_at IS NOT NULL AND resolved_at IS NULL
RETURNING resolved_at;
