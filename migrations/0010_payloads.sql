-- Large tool results as payloads (issue 13): a tool result over the executor's
-- threshold is stored here, apart from the step log, and the step keeps only a
-- truncated view with a reference (sha256, size, media type). So no message on
-- the executor stream grows with a tool's output, and one oversized result can
-- no longer end a stream that carries other runs.
--
-- Content-addressed per workspace: the same bytes uploaded twice (a retry
-- after a crash, two runs reading the same page) are one payload. A payload
-- uploaded but never referenced (the executor died before the commit) is
-- harmless: replay reads only the steps, and a step references only a payload
-- that was whole before the step was committed.
--
-- Uploads arrive in chunks (each well under the gRPC message limit), appended
-- in order; the chunk that completes the size is checked against the hash and
-- only then is the payload row written.
CREATE TABLE payload_chunks (
    workspace_id text NOT NULL REFERENCES workspaces,
    sha256       text NOT NULL,
    "offset"     bigint NOT NULL,
    data         bytea NOT NULL,
    PRIMARY KEY (workspace_id, sha256, "offset"),
    CONSTRAINT payload_chunk_offset_not_negative CHECK ("offset" >= 0)
);

CREATE TABLE payloads (
    workspace_id text NOT NULL REFERENCES workspaces,
    sha256       text NOT NULL,
    size         bigint NOT NULL,
    media_type   text NOT NULL,
    -- The run whose executor completed the upload first.
    run_id       uuid NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, sha256),
    CONSTRAINT payload_sha256_is_hex CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    CONSTRAINT payload_size_not_negative CHECK (size >= 0)
);
