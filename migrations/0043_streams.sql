-- Durable Streams (issue 42): append-only logs a workspace writes under
-- /v1/workspaces/{workspace_id}/streams/{path}, spoken over the Durable Streams protocol
-- so the ecosystem's clients (@durable-streams/client, the Python durable-streams) and
-- its conformance suite work unchanged. Postgres is the source of truth: a stream's
-- messages, its idempotent producers' (id, epoch, seq) and its closing are rows here,
-- so every replica serves every reader and a retried append lands at most once.
--
-- A stream is one row, locked FOR UPDATE by each append, close and delete (appends
-- to one stream are serialised; different streams never wait on each other). Its
-- offsets are the protocol's opaque, monotonic `RRRRRRRRRRRRRRRR_BBBBBBBBBBBBBBBB`
-- (a read sequence and a byte position, both zero-padded, so text order is log order);
-- `tail_offset` is the offset after its last message.
CREATE TABLE streams (
    workspace_id     text NOT NULL REFERENCES workspaces,
    stream_id        bigint GENERATED ALWAYS AS IDENTITY,
    path             text NOT NULL,
    content_type     text,
    ttl_seconds      bigint CONSTRAINT streams_ttl_check CHECK (ttl_seconds >= 0),
    -- Stream-Expires-At as the creator wrote it (echoed back), and as a time.
    expires_at_text  text,
    expires_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    accessed_at      timestamptz NOT NULL DEFAULT now(),
    tail_offset      text NOT NULL DEFAULT '0000000000000000_0000000000000000',
    closed           boolean NOT NULL DEFAULT false,
    -- The producer append that closed it: its retry is a duplicate, not a conflict.
    closed_by        jsonb,
    -- The last Stream-Seq a writer coordinated with (compared as text, as the protocol says).
    last_seq         text,
    -- A fork reads its source up to fork_offset, then its own messages.
    forked_from      bigint,
    fork_offset      text,
    fork_sub_offset  integer,
    -- Forks alive on this stream: deleting it while any is only hides it (soft_deleted).
    ref_count        integer NOT NULL DEFAULT 0,
    soft_deleted     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (workspace_id, stream_id),
    CONSTRAINT streams_path_unique UNIQUE (workspace_id, path),
    FOREIGN KEY (workspace_id, forked_from) REFERENCES streams
);

-- One row per append; end_offset is the stream's offset after it (the protocol's
-- message offset). JSON streams keep each append's values as `v1,v2,` (compact).
CREATE TABLE stream_messages (
    workspace_id  text NOT NULL,
    stream_id     bigint NOT NULL,
    end_offset    text NOT NULL,
    data          bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, stream_id, end_offset),
    FOREIGN KEY (workspace_id, stream_id) REFERENCES streams ON DELETE CASCADE
);

-- Idempotent producers: the highest (epoch, seq) accepted from each producer id.
CREATE TABLE stream_producers (
    workspace_id  text NOT NULL,
    stream_id     bigint NOT NULL,
    producer_id   text NOT NULL,
    epoch         bigint NOT NULL,
    last_seq      bigint NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, stream_id, producer_id),
    FOREIGN KEY (workspace_id, stream_id) REFERENCES streams ON DELETE CASCADE
);

-- The workspace feed (the read-only stream `_agentrun/feed`): what happened in the
-- workspace, in commit order, so that a reader keeping a cursor catches up exactly once.
-- Triggers write one row per event in the transaction that makes it: a run created or
-- changing state (status or wait_reason: `waiting` for `human` is an unknown outcome
-- waiting for a person), an approval requested or decided, a session created. A reader
-- takes rows of finished transactions only (xid below the snapshot's xmin), ordered by
-- (xid, event_id): a row committed later always sorts after every row already served.
CREATE TABLE workspace_events (
    workspace_id  text NOT NULL,
    event_id      bigint GENERATED ALWAYS AS IDENTITY,
    xid           xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at            timestamptz NOT NULL DEFAULT now(),
    kind          text NOT NULL,
    object_id     text NOT NULL,
    detail        jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (workspace_id, event_id)
);

CREATE INDEX workspace_events_in_order ON workspace_events (workspace_id, xid, event_id);

CREATE FUNCTION workspace_events_runs_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    SELECT workspace_id, 'run.created', run_id::text,
           jsonb_build_object('agent_id', agent_id, 'status', status)
    FROM inserted;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_feed_insert AFTER INSERT ON runs REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION workspace_events_runs_created();

CREATE FUNCTION workspace_events_run_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    VALUES (NEW.workspace_id, 'run.state', NEW.run_id::text,
            jsonb_build_object('agent_id', NEW.agent_id, 'status', NEW.status,
                               'wait_reason', NEW.wait_reason));
    RETURN NULL;
END $$;

CREATE TRIGGER runs_feed_state AFTER UPDATE OF status, wait_reason ON runs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.wait_reason IS DISTINCT FROM NEW.wait_reason)
    EXECUTE FUNCTION workspace_events_run_state();

CREATE FUNCTION workspace_events_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    VALUES (NEW.workspace_id,
            CASE WHEN TG_OP = 'INSERT' THEN 'approval.requested' ELSE 'approval.decided' END,
            NEW.approval_id::text,
            jsonb_build_object('run_id', NEW.run_id, 'tool', NEW.tool,
                               'decision', NEW.decision, 'decided_by', NEW.decided_by));
    RETURN NULL;
END $$;

CREATE TRIGGER approvals_feed_insert AFTER INSERT ON approvals FOR EACH ROW
    EXECUTE FUNCTION workspace_events_approval();

CREATE TRIGGER approvals_feed_decided AFTER UPDATE OF decision ON approvals FOR EACH ROW
    WHEN (OLD.decision IS NULL AND NEW.decision IS NOT NULL)
    EXECUTE FUNCTION workspace_events_approval();

CREATE FUNCTION workspace_events_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    VALUES (NEW.workspace_id, 'session.created', NEW.session_id::text,
            jsonb_build_object('agent_id', NEW.agent_id, 'title', NEW.title));
    RETURN NULL;
END $$;

CREATE TRIGGER sessions_feed_insert AFTER INSERT ON sessions FOR EACH ROW
    EXECUTE FUNCTION workspace_events_session();

-- Model output while it is generated (the deltas an executor streams for the decision
-- step `seq` of a run it holds at `epoch`; `idx` counts them from 0 per model call), kept
-- so that a reader of the run's stream joining mid-call from offset 0 receives what every
-- other reader received. The committed decision stays the record: once step `seq` is
-- committed, its deltas are no longer served (the stream is compacted to the decision),
-- and they are deleted when the run's next call streams. A delta lands only while its
-- epoch holds the run (a fenced holder's are refused) and at most once (its key).
CREATE TABLE run_deltas (
    workspace_id  text NOT NULL,
    run_id        uuid NOT NULL,
    seq           integer NOT NULL,
    epoch         bigint NOT NULL,
    idx           integer NOT NULL,
    text          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, run_id, seq, epoch, idx),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs ON DELETE CASCADE
);

-- ListSessions pages through a workspace's sessions newest first, by creation (a key
-- that does not move as sessions get turns, so a page never skips or repeats one).
CREATE INDEX sessions_by_created ON sessions (workspace_id, created_at DESC, session_id DESC);
