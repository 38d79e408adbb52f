-- Identity and access (issue 9). Until now any caller could act as any
-- workspace: nothing was checked. Credentials are API keys kept only as a
-- SHA-256 of their 256-bit secret (the key text is shown once), each of one
-- kind: a workspace key (one workspace, one role, a principal name), an
-- executor credential (scoped to the workspaces its pool may serve; NULL
-- scope = all) or a platform admin key (creates workspaces). People who sign
-- in with OpenID Connect get their role in a workspace from workspace_members.
-- Every privileged write appends to audit_log in the same transaction as the
-- write itself. runs.started_by records who started a run (four eyes: the
-- starter may not approve its own run's calls).

CREATE TABLE api_keys (
    key_id          text PRIMARY KEY CHECK (key_id ~ '^[a-z0-9]{16}$'),
    kind            text NOT NULL,
    workspace_id    text REFERENCES workspaces,
    role            text,
    principal       text NOT NULL CHECK (length(principal) BETWEEN 1 AND 200),
    scope           text[],
    secret_sha256   bytea NOT NULL CHECK (length(secret_sha256) = 32),
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz,
    revoked_at      timestamptz,
    CONSTRAINT api_key_kind_known CHECK (kind IN ('workspace', 'executor', 'platform')),
    CONSTRAINT api_key_workspace_iff_workspace_kind CHECK (
        (kind = 'workspace') = (workspace_id IS NOT NULL)),
    CONSTRAINT api_key_role_iff_workspace_kind CHECK (
        (kind = 'workspace') = (role IS NOT NULL)),
    CONSTRAINT api_key_role_known CHECK (
        role IS NULL OR role IN ('admin', 'operator', 'reader', 'approver')),
    CONSTRAINT api_key_scope_only_for_executors CHECK (kind = 'executor' OR scope IS NULL),
    CONSTRAINT api_key_expires_after_creation CHECK (expires_at IS NULL OR expires_at > created_at)
);

CREATE INDEX api_keys_by_workspace ON api_keys (workspace_id, created_at, key_id)
    WHERE workspace_id IS NOT NULL;

-- People who sign in (OpenID Connect), by verified email, and their role.
CREATE TABLE workspace_members (
    workspace_id  text NOT NULL REFERENCES workspaces,
    person        text NOT NULL CHECK (length(person) BETWEEN 3 AND 320 AND person LIKE '%@%'),
    role          text NOT NULL CHECK (role IN ('admin', 'operator', 'reader', 'approver')),
    added_by      text NOT NULL,
    added_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, person)
);

-- Append-only: who did what to which object, when, under which request.
CREATE TABLE audit_log (
    workspace_id  text NOT NULL,
    audit_id      bigint GENERATED ALWAYS AS IDENTITY,
    at            timestamptz NOT NULL DEFAULT now(),
    actor         text NOT NULL,
    action        text NOT NULL,
    object_kind   text NOT NULL,
    object_id     text NOT NULL,
    request_id    text NOT NULL,
    detail        jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (workspace_id, audit_id)
);

ALTER TABLE runs ADD COLUMN started_by text;
