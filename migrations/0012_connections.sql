-- Connected accounts (issue 11): a workspace's OAuth grants at the tool providers, with their
-- tokens sealed by the workspace's data key (control_plane/crypto/envelope.py, purpose
-- "connection_token", bound to workspace, connection and which token), never in plain text.
--
-- status: active (usable, the access token may still need a refresh), expired (the access
-- token lapsed and no refresh token is held), revoked (the provider or a user revoked the
-- grant), needs_reauth (a refresh was refused: the owner must connect again).
-- token_generation counts stored pairs: a refresh stores generation n+1 only if it still
-- reads n, so two writers can never interleave an old pair over a new one.
CREATE TABLE connections (
    workspace_id      text NOT NULL REFERENCES workspaces,
    connection_id     uuid NOT NULL,
    provider          text NOT NULL CHECK (provider ~ '^[a-z][a-z0-9_-]{0,62}$'),
    account           text NOT NULL CHECK (length(account) BETWEEN 1 AND 320),
    -- The principal label (kind:name) that connected it: asked to reconnect when it breaks.
    owner             text NOT NULL CHECK (length(owner) BETWEEN 1 AND 400),
    scopes            text[] NOT NULL DEFAULT '{}',
    status            text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'expired', 'revoked', 'needs_reauth')),
    access_sealed     bytea,
    refresh_sealed    bytea,
    access_expires_at timestamptz,
    token_generation  bigint NOT NULL DEFAULT 1,
    -- Why the connection is not active (no token text ever: the provider's error code).
    status_reason     text NOT NULL DEFAULT '',
    -- When its owner was asked to reconnect (once per break; a reconnect clears it).
    notified_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, connection_id),
    UNIQUE (workspace_id, provider, account),
    CONSTRAINT connection_active_has_token CHECK (status <> 'active' OR access_sealed IS NOT NULL)
);

-- An authorization in flight: the state parameter (stored only as its SHA-256) and the PKCE
-- verifier (sealed, bound to the flow's id), from the start link to the callback.
CREATE TABLE connection_flows (
    state_sha256      bytea PRIMARY KEY CHECK (length(state_sha256) = 32),
    workspace_id      text NOT NULL REFERENCES workspaces,
    flow_id           uuid NOT NULL,
    provider          text NOT NULL,
    owner             text NOT NULL,
    scopes            text[] NOT NULL,
    verifier_sealed   bytea NOT NULL,
    -- A reconnect link names the connection it repairs.
    connection_id     uuid,
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL
);

CREATE INDEX connection_flows_expiry ON connection_flows (expires_at);

-- Runs parked on a connection (wait_reason 'connection'): reconnecting wakes them all.
ALTER TABLE runs ADD COLUMN waiting_connection_id uuid;
CREATE INDEX runs_waiting_connection ON runs (workspace_id, waiting_connection_id)
    WHERE waiting_connection_id IS NOT NULL;
