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
