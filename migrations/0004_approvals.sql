-- Human approvals: the approval a tool call waits on (with a hash of its
-- exact arguments), single-use capability tokens kept only as hashes, and the
-- transactional outbox that notifies approvers after the commit.

ALTER TABLE steps DROP CONSTRAINT steps_kind_check;
ALTER TABLE steps ADD CONSTRAINT steps_kind_check CHECK (
    kind IN ('input', 'model_decision', 'tool_started', 'tool_result', 'park', 'finish',
             'approval_requested', 'approval_decided'));

CREATE TABLE approvals (
    workspace_id      text NOT NULL,
    approval_id       uuid NOT NULL,
    run_id            uuid NOT NULL,
    decision_seq      integer NOT NULL,
    call_id           text NOT NULL,
    tool              text NOT NULL,
    arguments         jsonb NOT NULL,
    arguments_sha256  text NOT NULL CHECK (arguments_sha256 ~ '^[0-9a-f]{64}$'),
    approvers         text[] NOT NULL,
    slack_approvers   text[] NOT NULL DEFAULT '{}',
    high_risk         boolean NOT NULL DEFAULT false,
    moves_money       boolean NOT NULL DEFAULT false,
    expire_at         timestamptz NOT NULL,
    expiry_seconds    integer NOT NULL CHECK (expiry_seconds > 0),
    on_expiry         text NOT NULL CHECK (on_expiry IN ('reject', 'escalate', 'remind')),
    escalate_to       text[] NOT NULL DEFAULT '{}',
    max_reminders     integer NOT NULL DEFAULT 2,
    escalation_level  integer NOT NULL DEFAULT 0,
    reminders_sent    integer NOT NULL DEFAULT 0,
    -- NULL while pending; set exactly once by a compare-and-set.
    decision          text CHECK (decision IN ('approved', 'rejected', 'edited', 'expired')),
    decided_by        text,
    decided_at        timestamptz,
    reason            text,
    edited_arguments  jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, approval_id),
    UNIQUE (workspace_id, run_id, call_id),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs,
    CONSTRAINT approval_decided_fully CHECK (
        (decision IS NULL) = (decided_at IS NULL) AND (decision IS NULL) = (decided_by IS NULL)),
    CONSTRAINT approval_edit_has_arguments CHECK (
        (decision = 'edited') = (edited_arguments IS NOT NULL)),
    -- Money never moves without a human: expiry may not approve it, and no
    -- policy can make it approve anything.
    CONSTRAINT approval_money_needs_a_human CHECK (
        NOT moves_money OR decision IS NULL OR decision <> 'approved' OR decided_by NOT LIKE 'system:%')
);

-- The expiry loop's index: pending approvals by expiry.
CREATE INDEX approvals_pending_expiry ON approvals (expire_at) WHERE decision IS NULL;
CREATE INDEX approvals_by_created ON approvals (workspace_id, created_at DESC, approval_id DESC);

-- Capability links: only the SHA-256 of each token is stored.
CREATE TABLE approval_tokens (
    workspace_id  text NOT NULL,
    token_sha256  bytea NOT NULL,
    approval_id   uuid NOT NULL,
    approver      text NOT NULL,
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, token_sha256),
    FOREIGN KEY (workspace_id, approval_id) REFERENCES approvals
);

-- The transactional outbox: written in the same transaction as what it
-- announces, delivered afterwards by the relay (at least once, with a stable
-- notification id so a redelivery is recognisable).
CREATE TABLE outbox (
    workspace_id     text NOT NULL,
    notification_id  uuid NOT NULL,
    kind             text NOT NULL,
    channel          text NOT NULL CHECK (channel IN ('mail', 'chat')),
    recipient        text NOT NULL,
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, notification_id)
);

CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL;
