-- Tools as data (issue 18): a workspace's own tools, versioned, beside the platform's
-- shared built-in entries (workspace_id '', source 'builtin'), in one registry.
--
-- A row is one immutable version of one tool: `definition` is the agentrun.v1.Tool message
-- as JSON (proto field names) without the fields the key and the columns hold (workspace,
-- name, version, builtin, create_time, created_by, source). Saving a definition equal to the
-- latest version saves nothing (control_plane/store/tools.py). No credential is ever part of
-- a definition: a tool names a connection, the token is fetched at call time.
CREATE TABLE tools (
    workspace_id text NOT NULL,
    name         text NOT NULL CONSTRAINT tool_name_shape CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    version      integer NOT NULL CONSTRAINT tool_version_positive CHECK (version > 0),
    definition   jsonb NOT NULL,
    source       text NOT NULL,
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, name, version)
);

-- An agent version pins the registry entries it was published with: name ->
-- {"workspace_id": '' (shared) or its own, "version": n}. Its runs use exactly those.
-- `code_tools` are the pinned built-ins (tools that need executor code): only executors
-- carrying all of them claim its runs (lease.sql run_claim_due). NULL on versions published
-- before the registry: the claim then checks every one of spec.tools, as it always did.
ALTER TABLE agent_versions ADD COLUMN tool_versions jsonb, ADD COLUMN code_tools jsonb;
