-- Web console sessions (control_plane/http/console/): a browser that signed in (OpenID
-- Connect for people, a pasted API key for operators) holds an opaque random token in an
-- HttpOnly, SameSite=Strict cookie; the database keeps only its SHA-256, like api_keys.
-- The row names the principal the console acts as, so every page reads through the same
-- access rules as gRPC; a key session also names its key, so revoking the key ends it.
-- Sessions end at expires_at (a fixed lifetime) or when signed out (the row is deleted).

CREATE TABLE console_sessions (
    session_sha256  bytea PRIMARY KEY CHECK (length(session_sha256) = 32),
    workspace_id    text NOT NULL REFERENCES workspaces,
    kind            text NOT NULL CHECK (kind IN ('key', 'person')),
    principal       text NOT NULL,
    role            text NOT NULL,
    -- The key's id (kind key) or the person's OIDC subject (kind person); never a secret.
    credential_id   text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    CHECK (expires_at > created_at)
);

CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
