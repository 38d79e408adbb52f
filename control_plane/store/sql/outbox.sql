-- name: outbox_insert :exec
-- Queue a notification in the same transaction as what it announces, and the same
-- notification once per webhook channel of the workspace (its id fixed now: the webhook-id
-- every retry repeats; the body names the row's own channel and recipient). Both inserts
-- take their values from the parameters and the channels, not from each other: Citus
-- plans no INSERT ... SELECT from a writing CTE.
WITH note AS (
    INSERT INTO outbox (workspace_id, notification_id, kind, channel, recipient, payload)
    VALUES ($1, $2, $3, $4, $5, $6::jsonb)
), hooks AS (
    INSERT INTO outbox (workspace_id, notification_id, kind, channel, recipient, payload)
    SELECT c.workspace_id, gen_random_uuid(), $3, 'webhook', c.channel_id::text,
           $6::jsonb || jsonb_build_object('channel', $4::text, 'recipient', $5::text)
    FROM channels c
    WHERE c.workspace_id = $1 AND c.kind = 'webhook' AND $4::text <> 'webhook'
)
SELECT 1;

-- name: outbox_due_workspaces :many
-- Up to $1 workspaces with a notification due, the longest waiting first. No lock:
-- on Citus this reads every shard, which a locking read may not.
SELECT workspace_id FROM outbox
WHERE delivered_at IS NULL AND next_attempt_at <= coalesce($2::timestamptz, now())
GROUP BY workspace_id
ORDER BY min(next_attempt_at)
LIMIT $1;

-- name: outbox_claim :many
-- Take up to $1 of workspace $4's due notifications and push their next attempt out,
-- so a relay that dies mid-delivery leaves them to be retried, not lost. (One workspace:
-- one shard on Citus; the next attempt is one subquery because Citus refuses a stable
-- timestamptz + interval over a column in a write.)
WITH due AS (
    SELECT workspace_id, notification_id FROM outbox
    WHERE workspace_id = $4
      AND delivered_at IS NULL AND next_attempt_at <= coalesce($3::timestamptz, now())
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox o SET attempts = o.attempts + 1,
    next_attempt_at = (SELECT coalesce($3::timestamptz, now())
                              + make_interval(secs => least($2 * power(2, o.attempts), 300)))
FROM due
WHERE o.workspace_id = $4
  AND o.workspace_id = due.workspace_id AND o.notification_id = due.notification_id
RETURNING o.*;

-- name: outbox_delivered :exec
-- Mark a notification delivered, with what the channel answered ($3, JSON or NULL).
UPDATE outbox SET delivered_at = now(), last_error = NULL, receipt = $3::jsonb
WHERE workspace_id = $1 AND notification_id = $2;

-- name: outbox_failed :exec
-- Record why an attempt failed (the next attempt time was set by the claim).
UPDATE outbox SET last_error = $3 WHERE workspace_id = $1 AND notification_id = $2;

-- name: outbox_chat_for_approval :many
-- The chat notifications an approval has had (request, reminders, escalation): what was
-- sent ($2's messages to edit, with their receipts) and whether any is still to be sent.
SELECT notification_id, receipt, delivered_at FROM outbox
WHERE workspace_id = $1 AND channel = 'chat' AND kind <> 'approval_closed'
  AND payload ->> 'approval_id' = $2::text;
