-- Triggers and sessions: what starts runs besides StartRun.
--
-- A trigger (signed webhook, schedule, inbound mail, mail push source) turns
-- events into runs. Each event is recorded together with the run it starts,
-- in one statement, under unique (workspace_id, trigger_id, dedupe_key): a
-- redelivered webhook, a second scheduler replica firing the same slot or a
-- refetched mail lands on the first event and its run. Events that filters
-- stop are recorded too, as filtered, with the reason and no run.
--
-- A session is a conversation with one agent; each turn is a run. The session
-- row is the lock that keeps two turns of one conversation from running at once.

CREATE TABLE triggers (
    workspace_id          text NOT NULL REFERENCES workspaces,
    trigger_id            text NOT NULL CHECK (trigger_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    agent_id              text NOT NULL,
    kind                  text NOT NULL,
    enabled               boolean NOT NULL DEFAULT true,
    -- How HTTP deliveries are signed; NULL for schedules (nobody calls them).
    scheme                text,
    -- Kind-specific settings: replay window, dedupe source, cron and time
    -- zone, interval, jitter, input text, mailbox URL, chain depth limit.
    config                jsonb NOT NULL DEFAULT '{}',
    -- Cheap rules applied before a run exists (control_plane/triggers/filters.py).
    filters               jsonb NOT NULL DEFAULT '[]',
    -- Schedules: the next slot (as the schedule says) and when it fires (the
    -- slot plus the trigger's deterministic jitter).
    next_slot_at          timestamptz,
    next_fire_at          timestamptz,
    -- Push sources: the newest history id announced, the last one whose
    -- messages all committed, and when a fetch is due (while a fetcher holds
    -- it: its lease expiry, as runs.wake_at is).
    announced_history_id  bigint,
    last_history_id       bigint,
    fetch_due_at          timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, trigger_id),
    FOREIGN KEY (workspace_id, agent_id) REFERENCES agents,
    CONSTRAINT trigger_kind_known CHECK (kind IN ('webhook', 'schedule', 'mail', 'mail_push')),
    CONSTRAINT trigger_scheme_known CHECK (
        scheme IN ('hmac_sha256', 'stripe', 'slack', 'github', 'standard_webhooks')),
    CONSTRAINT trigger_http_is_signed CHECK ((kind = 'schedule') = (scheme IS NULL)),
    CONSTRAINT trigger_schedule_has_slot CHECK (
        (kind = 'schedule') = (next_slot_at IS NOT NULL AND next_fire_at IS NOT NULL)),
    CONSTRAINT trigger_fire_not_before_slot CHECK (next_fire_at >= next_slot_at)
);

-- The scheduler's one index: enabled schedules by fire time.
CREATE INDEX triggers_schedule_due ON triggers (next_fire_at)
    WHERE kind = 'schedule' AND enabled;

-- Push sources with a fetch queued (or held by a fetcher until its lease lapses).
CREATE INDEX triggers_fetch_due ON triggers (fetch_due_at)
    WHERE fetch_due_at IS NOT NULL;

-- Signing secrets. Two may be active while a sender rotates; a rotated-out
-- secret keeps working until expires_at, then never again. Never returned by
-- any API after the response that created it.
CREATE TABLE trigger_secrets (
    workspace_id  text NOT NULL,
    trigger_id    text NOT NULL,
    secret_id     integer NOT NULL CHECK (secret_id > 0),
    secret        text NOT NULL CHECK (length(secret) BETWEEN 8 AND 512),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    PRIMARY KEY (workspace_id, trigger_id, secret_id),
    FOREIGN KEY (workspace_id, trigger_id) REFERENCES triggers
);

CREATE TABLE trigger_events (
    workspace_id   text NOT NULL,
    event_id       uuid NOT NULL,
    trigger_id     text NOT NULL,
    -- Whatever the source guarantees stable: the delivery id, the Message-ID,
    -- agent_id:scheduled_for.
    dedupe_key     text NOT NULL CHECK (length(dedupe_key) BETWEEN 1 AND 512),
    status         text NOT NULL,
    -- Why a filtered event started no run.
    reason         text,
    run_id         uuid,
    -- Schedules: the slot this event fires (before jitter).
    scheduled_for  timestamptz,
    -- Mail: how many agent hops the message has behind it (0 = a human's).
    chain_depth    integer NOT NULL DEFAULT 0 CHECK (chain_depth >= 0),
    -- The event as received (a webhook's parsed body, a mail message).
    payload        jsonb NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, event_id),
    FOREIGN KEY (workspace_id, trigger_id) REFERENCES triggers,
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs,
    CONSTRAINT event_status_known CHECK (status IN ('accepted', 'filtered')),
    CONSTRAINT event_accepted_has_run CHECK ((status = 'accepted') = (run_id IS NOT NULL)),
    CONSTRAINT event_filtered_has_reason CHECK ((status = 'filtered') = (reason IS NOT NULL))
);

-- The dedupe constraint: one event (and so at most one run) per stable key.
CREATE UNIQUE INDEX trigger_events_dedupe ON trigger_events (workspace_id, trigger_id, dedupe_key);

-- Which event started a run (the chain depth of mail our agents send).
CREATE INDEX trigger_events_by_run ON trigger_events (run_id) WHERE run_id IS NOT NULL;

CREATE INDEX trigger_events_by_trigger
    ON trigger_events (workspace_id, trigger_id, received_at DESC, event_id DESC);

CREATE TABLE sessions (
    workspace_id  text NOT NULL REFERENCES workspaces,
    session_id    uuid NOT NULL,
    agent_id      text NOT NULL,
    title         text NOT NULL DEFAULT '',
    turn_count    integer NOT NULL DEFAULT 0 CHECK (turn_count >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, session_id),
    FOREIGN KEY (workspace_id, agent_id) REFERENCES agents
);

CREATE INDEX sessions_by_updated ON sessions (workspace_id, updated_at DESC, session_id DESC);

-- One row per turn; the turn's run holds its input, status and answer.
CREATE TABLE session_turns (
    workspace_id  text NOT NULL,
    session_id    uuid NOT NULL,
    turn          integer NOT NULL CHECK (turn > 0),
    run_id        uuid NOT NULL,
    -- Optional client-chosen key: a retried send returns the turn it created.
    request_id    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, session_id, turn),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions,
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs
);

CREATE UNIQUE INDEX session_turns_run ON session_turns (workspace_id, run_id);

CREATE UNIQUE INDEX session_turns_request_id ON session_turns (workspace_id, session_id, request_id)
    WHERE request_id IS NOT NULL;
