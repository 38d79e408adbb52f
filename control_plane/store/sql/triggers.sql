-- name: trigger_insert :one
-- Register a trigger; returns nothing when the id is taken. Database clock unless $11.
INSERT INTO triggers (workspace_id, trigger_id, agent_id, kind, scheme, config, filters,
                      next_slot_at, next_fire_at, last_history_id, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10,
        coalesce($11::timestamptz, now()), coalesce($11::timestamptz, now()))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: trigger_get :one
-- One trigger of a workspace.
SELECT * FROM triggers WHERE workspace_id = $1 AND trigger_id = $2;

-- name: trigger_lock :one
-- One trigger, locked until the caller's transaction ends (orders secret rotations).
SELECT * FROM triggers WHERE workspace_id = $1 AND trigger_id = $2 FOR UPDATE;

-- name: trigger_list :many
-- A page of a workspace's triggers by id, after a keyset cursor.
SELECT * FROM triggers
WHERE workspace_id = $1
  AND ($2::text IS NULL OR trigger_id > $2)
  AND ($3::text IS NULL OR agent_id = $3)
ORDER BY trigger_id
LIMIT $4;

-- name: trigger_set_enabled :one
-- Pause or resume a trigger.
UPDATE triggers SET enabled = $3, updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2
RETURNING *;

-- name: trigger_for_delivery :one
-- An enabled HTTP trigger with the secrets that verify deliveries now, newest first: their
-- ids, sealed values and (rows the startup backfill has not sealed yet) plain values, index
-- for index. Database clock unless $3. (The secrets are named by $1 and $2, not by the
-- outer row: so Citus plans the statement on one shard.)
SELECT t.*,
       array(SELECT s.secret_id FROM trigger_secrets s
             WHERE s.workspace_id = $1 AND s.trigger_id = $2
               AND (s.expires_at IS NULL OR s.expires_at > coalesce($3::timestamptz, now()))
             ORDER BY s.secret_id DESC) AS secret_ids,
       array(SELECT s.sealed FROM trigger_secrets s
             WHERE s.workspace_id = $1 AND s.trigger_id = $2
               AND (s.expires_at IS NULL OR s.expires_at > coalesce($3::timestamptz, now()))
             ORDER BY s.secret_id DESC) AS sealed_secrets,
       array(SELECT s.secret FROM trigger_secrets s
             WHERE s.workspace_id = $1 AND s.trigger_id = $2
               AND (s.expires_at IS NULL OR s.expires_at > coalesce($3::timestamptz, now()))
             ORDER BY s.secret_id DESC) AS plain_secrets
FROM triggers t
WHERE t.workspace_id = $1 AND t.trigger_id = $2 AND t.enabled AND t.kind <> 'schedule';

-- name: trigger_secret_next_id :one
-- The id the trigger's next secret takes (ids count up from 1); lock the trigger first.
SELECT coalesce(max(secret_id), 0) + 1 AS secret_id
FROM trigger_secrets WHERE workspace_id = $1 AND trigger_id = $2;

-- name: trigger_secret_insert :one
-- Add a sealed signing secret as the trigger's newest. Database clock unless $5.
INSERT INTO trigger_secrets (workspace_id, trigger_id, secret_id, sealed, created_at)
VALUES ($1, $2, $3, $4, coalesce($5::timestamptz, now()))
RETURNING secret_id, created_at, expires_at;

-- name: trigger_secrets_plaintext_workspaces :many
-- Up to $1 workspaces that have a secret still in plain text (written before sealing
-- existed). No lock: on Citus this reads every shard, which a locking read may not.
SELECT DISTINCT workspace_id FROM trigger_secrets
WHERE secret IS NOT NULL
ORDER BY workspace_id
LIMIT $1;

-- name: trigger_secrets_plaintext :many
-- Up to $1 of workspace $2's secrets still in plain text, locked for the caller's
-- transaction, skipping those another replica is sealing (one workspace: one shard).
SELECT workspace_id, trigger_id, secret_id, secret FROM trigger_secrets
WHERE workspace_id = $2 AND secret IS NOT NULL
ORDER BY trigger_id, secret_id
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: trigger_secret_seal :exec
-- Replace a plain secret by its sealed form, guarded by the plain value still being there.
UPDATE trigger_secrets SET sealed = $4, secret = NULL
WHERE workspace_id = $1 AND trigger_id = $2 AND secret_id = $3 AND secret IS NOT NULL;

-- name: trigger_secrets_retire :exec
-- Rotation: the newest active secret keeps verifying for $3 more seconds, any older one
-- stops now, so at most two are active once the new one is added. Database clock unless $4.
-- (The times are columns of a subquery, which the CASE picks: Citus refuses now() inside
-- coalesce or CASE in a write.)
UPDATE trigger_secrets s SET expires_at = least(
    coalesce(s.expires_at, 'infinity'),
    CASE WHEN s.secret_id = c.newest THEN c.grace_end ELSE c.now END)
FROM (SELECT coalesce($4::timestamptz, now()) AS now,
             coalesce($4::timestamptz, now()) + make_interval(secs => $3) AS grace_end,
             (SELECT max(m.secret_id) FROM trigger_secrets m
              WHERE m.workspace_id = $1 AND m.trigger_id = $2) AS newest) c
WHERE s.workspace_id = $1 AND s.trigger_id = $2
  AND (s.expires_at IS NULL OR s.expires_at > c.now);

-- name: trigger_secrets_active :many
-- The secrets that verify deliveries now, described (never their values), oldest first.
-- Database clock unless $3.
SELECT secret_id, created_at, expires_at FROM trigger_secrets
WHERE workspace_id = $1 AND trigger_id = $2
  AND (expires_at IS NULL OR expires_at > coalesce($3::timestamptz, now()))
ORDER BY secret_id;

-- name: trigger_event_admit :one
-- Record an event and, unless a filter stopped it (:reason says why), admit its run and input
-- step (run_admit), in one statement: no event without its run, no run without its event. A
-- redelivery (same dedupe key) inserts nothing and returns nothing. Database clock unless :now.
WITH event AS (
    INSERT INTO trigger_events (workspace_id, event_id, trigger_id, dedupe_key, status, reason,
                                run_id, scheduled_for, chain_depth, payload, received_at)
    VALUES (:workspace_id, :event_id, :trigger_id, :dedupe_key,
            CASE WHEN :reason::text IS NULL THEN 'accepted' ELSE 'filtered' END, :reason::text,
            CASE WHEN :reason::text IS NULL THEN :run_id::uuid END, :scheduled_for,
            :chain_depth, :event_payload::jsonb, coalesce(:now::timestamptz, now()))
    ON CONFLICT (workspace_id, trigger_id, dedupe_key) DO NOTHING
    RETURNING *
), admit_if AS (
    SELECT FROM event WHERE run_id IS NOT NULL
), {{run_admit}}
SELECT * FROM event;

-- name: trigger_event_by_key :one
-- The event a dedupe key recorded first.
SELECT * FROM trigger_events WHERE workspace_id = $1 AND trigger_id = $2 AND dedupe_key = $3;

-- name: trigger_event_run_depth :one
-- The chain depth of the event that started a run, in any workspace (mail between two
-- workspaces' agents is still a loop); nothing when no event started it.
SELECT chain_depth FROM trigger_events WHERE run_id = $1 LIMIT 1;

-- name: trigger_event_list :many
-- A page of a trigger's events, newest first, after a keyset cursor.
SELECT * FROM trigger_events
WHERE workspace_id = $1 AND trigger_id = $2
  AND ($3::timestamptz IS NULL OR (received_at, event_id) < ($3, $4::uuid))
ORDER BY received_at DESC, event_id DESC
LIMIT $5;

-- name: schedule_due_workspaces :many
-- Up to $2 workspaces with an enabled schedule whose fire time has come, the longest
-- overdue first. No lock: on Citus this reads every shard, which a locking read may not.
-- Database clock unless $1.
SELECT workspace_id FROM triggers
WHERE kind = 'schedule' AND enabled AND next_fire_at <= coalesce($1::timestamptz, now())
GROUP BY workspace_id
ORDER BY min(next_fire_at)
LIMIT $2;

-- name: schedule_claim_due :many
-- Lock up to $2 of workspace $3's enabled schedules whose fire time has come, skipping
-- those another replica holds, until the caller's transaction commits the slots it fired
-- (one workspace: one shard on Citus). Database clock unless $1.
SELECT t.*, coalesce($1::timestamptz, now()) AS db_now
FROM triggers t
WHERE t.workspace_id = $3
  AND t.kind = 'schedule' AND t.enabled AND t.next_fire_at <= coalesce($1::timestamptz, now())
ORDER BY t.next_fire_at
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: schedule_advance :exec
-- Move a schedule past the slot it just fired, guarded by that slot ($3).
UPDATE triggers SET next_slot_at = $4, next_fire_at = $5, updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2 AND next_slot_at = $3;

-- name: push_announce :one
-- A notification announced changes up to history id $3: remember the newest one and queue a
-- fetch if it is past the last processed id (a fetch in progress keeps its lease and queues
-- itself again if it missed this one). Database clock unless $4.
UPDATE triggers SET
    announced_history_id = greatest(announced_history_id, $3),
    -- (The clock as a subquery: Citus refuses now() inside coalesce or CASE in a write.)
    fetch_due_at = CASE WHEN $3 > coalesce(last_history_id, -1)
                        THEN coalesce(fetch_due_at, (SELECT coalesce($4::timestamptz, now())))
                        ELSE fetch_due_at END,
    updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2 AND kind = 'mail_push'
RETURNING announced_history_id, last_history_id, fetch_due_at;

-- name: push_due_workspaces :many
-- Up to $2 workspaces with a push source whose fetch is due, the longest waiting first.
-- No lock: on Citus this reads every shard, which a locking read may not. Database clock
-- unless $1.
SELECT workspace_id FROM triggers
WHERE fetch_due_at <= coalesce($1::timestamptz, now()) AND kind = 'mail_push' AND enabled
GROUP BY workspace_id
ORDER BY min(fetch_due_at)
LIMIT $2;

-- name: push_claim_due :many
-- Take up to $2 of workspace $4's push sources with a fetch due, each leased for $3
-- seconds: a fetcher that dies leaves the fetch due again when its lease lapses (one
-- workspace: one shard on Citus; the lease's end is one subquery, as Citus asks of a
-- write). Database clock unless $1.
WITH due AS (
    SELECT workspace_id, trigger_id FROM triggers
    WHERE workspace_id = $4
      AND fetch_due_at <= coalesce($1::timestamptz, now()) AND kind = 'mail_push' AND enabled
    ORDER BY fetch_due_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE triggers t SET
    fetch_due_at = (SELECT coalesce($1::timestamptz, now()) + make_interval(secs => $3)),
    updated_at = now()
FROM due
WHERE t.workspace_id = $4
  AND t.workspace_id = due.workspace_id AND t.trigger_id = due.trigger_id
RETURNING t.*;

-- name: push_advance :one
-- Every event up to history id $3 has committed: move the cursor there (never backwards) and
-- clear the fetch, unless a newer id was announced meanwhile. Database clock unless $4.
UPDATE triggers SET
    last_history_id = greatest(last_history_id, $3),
    fetch_due_at = CASE WHEN announced_history_id > greatest(last_history_id, $3)
                        THEN (SELECT coalesce($4::timestamptz, now())) END,
    fetch_error = NULL,
    updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2
RETURNING last_history_id, announced_history_id, fetch_due_at;

-- name: push_park :exec
-- The source's connection cannot be used: stop fetching (no retry every lease) and say why
-- on the trigger. The next notification queues a fetch again (push_announce), so a
-- reconnected connection picks up where the cursor stands.
UPDATE triggers SET fetch_due_at = NULL, fetch_error = $3, updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2 AND kind = 'mail_push';

-- name: schedule_postpone :exec
-- A slot that could not be fired is tried again at $4 (the slot stays the same).
UPDATE triggers SET next_fire_at = greatest($4, next_slot_at), updated_at = now()
WHERE workspace_id = $1 AND trigger_id = $2 AND next_slot_at = $3;
