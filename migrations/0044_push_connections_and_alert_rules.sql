-- Push sources fetch on a connection's own OAuth token, and alert rules (issue 43).
--
-- A mailbox's history API wants the mailbox owner's access token. A push trigger now names a
-- connection (its config's connection_id) and fetches with that connection's token. When the
-- connection cannot be used (revoked, needs its owner to connect again), the fetch is parked
-- rather than retried every lease: fetch_error says why, on the trigger, until a fetch works.
ALTER TABLE triggers ADD COLUMN fetch_error text;

-- Alert rules (issue 43): a condition over the workspace's runs, evaluated by a loop on the
-- database clock, that fires once per breach through one of the workspace's channels.
-- failure_rate: at least min_finished runs (of agent_id, or all) finished in the last
-- window_seconds and at least `threshold` of them failed. stuck_on_person: a run has waited
-- on a person (an approval, a question, an unknown outcome) longer than waiting_seconds.
-- fired_at is set (and resolved_at cleared) by the one guarded update that fires, in the
-- transaction that queues the notification; resolved_at is set when the condition no longer
-- holds, so the next breach fires again and a breach that lasts fires once.
CREATE TABLE alert_rules (
    workspace_id     text NOT NULL REFERENCES workspaces,
    name             text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    channel_id       uuid NOT NULL,
    -- For slack and email channels: the Slack channel or the address to tell.
    recipient        text NOT NULL DEFAULT '',
    kind             text NOT NULL CHECK (kind IN ('failure_rate', 'stuck_on_person')),
    agent_id         text,
    window_seconds   integer NOT NULL DEFAULT 0 CHECK (window_seconds >= 0),
    min_finished     integer NOT NULL DEFAULT 0 CHECK (min_finished >= 0),
    threshold        double precision NOT NULL DEFAULT 0 CHECK (threshold BETWEEN 0 AND 1),
    waiting_seconds  integer NOT NULL DEFAULT 0 CHECK (waiting_seconds >= 0),
    fired_at         timestamptz,
    resolved_at      timestamptz,
    fire_count       integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, name),
    FOREIGN KEY (workspace_id, channel_id) REFERENCES channels ON DELETE CASCADE
);
