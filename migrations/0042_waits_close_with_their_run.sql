-- Approvals close with their run (issue 43).
--
-- Cancelling a run that waited for an approval left the approval pending: it stayed in
-- `approvals list`, the console inbox and agentrun_approvals_pending until it expired,
-- and a decision on it was refused with a confusing "run is cancelled". Now the update
-- that ends a waiting run (cancel, max age, a failure, any path) closes its pending
-- approvals in the same transaction: decision 'closed', decided by `system:run`, the
-- reason naming how the run ended ("run cancelled: ..."). A later decision is refused
-- naming that. A trigger, like the other runs_*_finish triggers, so that no terminal
-- path is missed; it fires only for runs that were waiting, never on the hot path of a
-- held run's completion, and writes only the run's own workspace's rows (co-located).
ALTER TABLE approvals DROP CONSTRAINT approvals_decision_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_decision_check
    CHECK (decision IN ('approved', 'rejected', 'edited', 'expired', 'closed'));

-- An unknown outcome asks a person (issue 43). The park that waits for a person's decision
-- on a tool call whose outcome is unknown (wait_reason 'human') records its question here
-- and its notifications in the outbox, in the park's own transaction. The question carries
-- a policy like an approval's: every `every_seconds` (database clock, next_at) remind the
-- people asked, escalate to others, or fail the run; it closes when a person answers or
-- the run ends. Nothing else reads it to decide: the answer is still the step
-- ResolveUnknownOutcome appends (store/sql/unknowns.sql).
CREATE TABLE unknown_questions (
    workspace_id      text NOT NULL,
    run_id            uuid NOT NULL,
    seq               integer NOT NULL,  -- the unknown tool_result
    tool              text NOT NULL,
    recipients        text[] NOT NULL,   -- asked by mail
    slack_recipients  text[] NOT NULL DEFAULT '{}',  -- Slack users whose buttons answer
    every_seconds     integer NOT NULL CHECK (every_seconds > 0),
    on_timeout        text NOT NULL CHECK (on_timeout IN ('remind', 'escalate', 'fail')),
    escalate_to       text[] NOT NULL DEFAULT '{}',
    max_reminders     integer NOT NULL DEFAULT 2,
    -- The exact call (arguments, idempotency key, class) and what was tried.
    call              jsonb NOT NULL DEFAULT '{}',
    reminders_sent    integer NOT NULL DEFAULT 0,
    escalation_level  integer NOT NULL DEFAULT 0,
    next_at           timestamptz NOT NULL,
    closed_at         timestamptz,
    closed_reason     text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, run_id, seq),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs,
    CONSTRAINT unknown_question_closed_fully CHECK ((closed_at IS NULL) = (closed_reason IS NULL))
);

-- The policy loop's index: open questions by their next action.
CREATE INDEX unknown_questions_due ON unknown_questions (next_at) WHERE closed_at IS NULL;


-- Real channels, configured per workspace (issue 43). A workspace names where its
-- notifications go: Slack (the Web API's chat.postMessage / chat.update with a bot token),
-- e-mail over SMTP, and outgoing webhooks signed in the Standard Webhooks format. Each
-- channel's secret (the bot token, the SMTP password, the webhook signing secret) is sealed
-- with the workspace's data key like other secrets (crypto/envelope.py, purpose 'channel').
-- The relay delivers an outbox row through the workspace's channel of its kind (chat:
-- slack, mail: email), and each notification also becomes one row per webhook channel
-- (channel 'webhook', recipient the channel id), written in the same statement, so the
-- webhook's `webhook-id` (the row's id) is fixed before anything is sent.
CREATE TABLE channels (
    workspace_id   text NOT NULL REFERENCES workspaces,
    channel_id     uuid NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('slack', 'email', 'webhook')),
    name           text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    -- What is not secret: Slack's API base URL; the SMTP host, port, sender and TLS mode;
    -- the webhook's URL.
    config         jsonb NOT NULL,
    secret_sealed  bytea,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- A webhook subscribed to run lifecycle events (config.events): the newest finished_at
    -- it was given (control_plane/channels/lifecycle.py reads a window behind it).
    lifecycle_cursor timestamptz,
    PRIMARY KEY (workspace_id, channel_id),
    UNIQUE (workspace_id, name)
);

ALTER TABLE outbox DROP CONSTRAINT outbox_channel_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_channel_check
    CHECK (channel IN ('mail', 'chat', 'webhook'));
-- What the channel answered (Slack: the message's channel and ts, for a later chat.update).
ALTER TABLE outbox ADD COLUMN receipt jsonb;

-- The update that ends a waiting run closes its approvals and questions (see the top).
CREATE FUNCTION runs_close_approvals_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Closed when the run finished: its finished_at (the statement's clock, fixed or not).
    -- A closed approval that was posted to Slack gets its message edited to say so
    -- (an 'approval_closed' notification: the relay's chat.update of what it sent).
    WITH closed AS (
        UPDATE approvals SET decision = 'closed', decided_by = 'system:run',
                             decided_at = NEW.finished_at,
                             reason = 'run ' || NEW.status || coalesce(': ' || NEW.error, '')
        WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id AND decision IS NULL
        RETURNING workspace_id, approval_id, run_id, tool, reason, slack_approvers
    )
    INSERT INTO outbox (workspace_id, notification_id, kind, channel, recipient, payload)
    SELECT c.workspace_id, gen_random_uuid(), 'approval_closed', 'chat', '#approvals',
           jsonb_build_object('kind', 'approval_closed', 'approval_id', c.approval_id,
                              'run_id', c.run_id, 'tool', c.tool, 'reason', c.reason)
    FROM closed c WHERE cardinality(c.slack_approvers) > 0;
    UPDATE unknown_questions SET closed_at = NEW.finished_at,
                                 closed_reason = 'run ' || NEW.status || coalesce(': ' || NEW.error, '')
    WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id AND closed_at IS NULL;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_close_approvals AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'waiting' AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_close_approvals_on_finish();

-- Nothing waits forever unnoticed (issue 43): how long a run may wait for each kind of
-- thing (approval, human, repeat, connection, signal, child) before it fails, in seconds.
-- Only the workspace's own choices are stored; the platform's default applies to the
-- rest (control_plane/runs/wait_limits.py); 0 turns a kind off, by choice.
ALTER TABLE workspaces ADD COLUMN wait_limits jsonb NOT NULL DEFAULT '{}';
