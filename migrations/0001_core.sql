-- The durable run core: workspaces, agents and their immutable versions,
-- runs (with leases and the single wake_at column) and the append-only step
-- log. Every tenant table leads its keys with workspace_id, which is also the
-- distribution column if these tables are ever sharded by workspace.

CREATE TABLE workspaces (
    workspace_id     text PRIMARY KEY CHECK (workspace_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    plan             text NOT NULL DEFAULT 'team',
    max_concurrency  integer NOT NULL DEFAULT 20 CHECK (max_concurrency > 0),
    -- When the fair claim last handed this workspace a run.
    last_served_at   timestamptz NOT NULL DEFAULT '-infinity',
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE agents (
    workspace_id    text NOT NULL REFERENCES workspaces,
    agent_id        text NOT NULL CHECK (agent_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    display_name    text NOT NULL DEFAULT '',
    latest_version  integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, agent_id)
);

-- Immutable once written: a run names (agent_id, version) and keeps it.
CREATE TABLE agent_versions (
    workspace_id  text NOT NULL,
    agent_id      text NOT NULL,
    version       integer NOT NULL CHECK (version > 0),
    spec          jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, agent_id, version),
    FOREIGN KEY (workspace_id, agent_id) REFERENCES agents
);

CREATE TABLE runs (
    workspace_id      text NOT NULL REFERENCES workspaces,
    run_id            uuid NOT NULL,
    agent_id          text NOT NULL,
    agent_version     integer NOT NULL,
    status            text NOT NULL DEFAULT 'queued',
    wait_reason       text,
    -- Runnable at this time. While running it is the lease expiry; while
    -- waiting on an event it is NULL until the event sets it to now().
    wake_at           timestamptz,
    lease_owner       text,
    lease_epoch       bigint NOT NULL DEFAULT 0,
    attempt           integer NOT NULL DEFAULT 0,
    request_id        text,
    input             text NOT NULL,
    output            text,
    error             text,
    -- Limits copied from the agent version at admission.
    max_steps         integer NOT NULL,
    max_tokens        bigint NOT NULL,
    max_tool_calls    integer NOT NULL,
    deadline_seconds  integer NOT NULL,
    deadline_at       timestamptz NOT NULL,
    -- Counters.
    step_count        integer NOT NULL DEFAULT 0,
    model_calls       integer NOT NULL DEFAULT 0,
    tool_calls        integer NOT NULL DEFAULT 0,
    tokens_used       bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    PRIMARY KEY (workspace_id, run_id),
    FOREIGN KEY (workspace_id, agent_id, agent_version) REFERENCES agent_versions,
    CONSTRAINT run_status_known CHECK (
        status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled')),
    CONSTRAINT run_running_has_lease CHECK (
        status <> 'running' OR (lease_owner IS NOT NULL AND wake_at IS NOT NULL)),
    CONSTRAINT run_waiting_has_reason CHECK (
        (status = 'waiting') = (wait_reason IS NOT NULL)),
    CONSTRAINT run_terminal_is_final CHECK (
        (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT run_output_or_error CHECK (output IS NULL OR error IS NULL)
);

-- The one index the claim needs: every runnable-at-a-time run, whatever it
-- waits for (a queue slot, a sleep, a backoff, a lapsed lease).
CREATE INDEX runs_due ON runs (wake_at)
    WHERE status IN ('queued', 'running', 'waiting');

CREATE INDEX runs_by_created ON runs (workspace_id, created_at DESC, run_id DESC);

CREATE UNIQUE INDEX runs_request_id ON runs (workspace_id, agent_id, request_id)
    WHERE request_id IS NOT NULL;

-- Append-only. A step row is never updated or deleted.
CREATE TABLE steps (
    workspace_id  text NOT NULL,
    run_id        uuid NOT NULL,
    seq           integer NOT NULL CHECK (seq >= 0),
    kind          text NOT NULL CHECK (
        kind IN ('input', 'model_decision', 'tool_started', 'tool_result', 'park', 'finish')),
    -- The lease epoch the step was written under (0 for the admission step).
    epoch         bigint NOT NULL,
    ref_seq       integer,
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, run_id, seq),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs,
    CONSTRAINT step_ref_is_earlier CHECK (ref_seq IS NULL OR ref_seq < seq)
);
