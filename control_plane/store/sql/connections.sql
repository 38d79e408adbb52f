-- name: connection_insert :one
-- A new connection from a finished authorization (or the reconnected one: same workspace,
-- provider and account), tokens sealed; its id.
-- (updated_at comes in through EXCLUDED: Citus refuses now() in DO UPDATE SET.)
INSERT INTO connections (workspace_id, connection_id, provider, account, owner, scopes, status,
                         access_sealed, refresh_sealed, access_expires_at, updated_at)
VALUES (:workspace_id, :connection_id, :provider, :account, :owner, :scopes, 'active',
        :access_sealed, :refresh_sealed, now() + make_interval(secs => :expires_in), now())
ON CONFLICT (workspace_id, provider, account) DO UPDATE
SET owner = EXCLUDED.owner, scopes = EXCLUDED.scopes, status = 'active', status_reason = '',
    access_sealed = EXCLUDED.access_sealed, refresh_sealed = EXCLUDED.refresh_sealed,
    access_expires_at = EXCLUDED.access_expires_at, notified_at = NULL,
    token_generation = connections.token_generation + 1, updated_at = EXCLUDED.updated_at
-- The tokens were sealed for this id: a row of another id (a racing callback) is left alone.
WHERE connections.connection_id = EXCLUDED.connection_id
RETURNING connection_id, (xmax <> 0) AS reconnected;

-- name: connection_get :one
-- One connection with its sealed tokens and whether its access token is due for a refresh
-- (expired, or expiring within :margin seconds, by the database clock).
SELECT *, coalesce(access_expires_at <= now() + make_interval(secs => :margin), true) AS due
FROM connections WHERE workspace_id = :workspace_id AND connection_id = :connection_id;

-- name: connection_list :many
-- A workspace's connections, newest first (tokens are never selected for listing).
SELECT workspace_id, connection_id, provider, account, owner, scopes, status, status_reason,
       access_expires_at, created_at, updated_at
FROM connections WHERE workspace_id = :workspace_id
ORDER BY created_at DESC, connection_id
LIMIT :limit;

-- name: connection_refresh_lock :one
-- Single-flight refresh of one connection, across replicas: an advisory lock held until the
-- caller's transaction ends (never a row lock across the provider's HTTP call). The caller
-- sets lock_timeout; a crashed holder's session ends and the lock with it.
SELECT pg_advisory_xact_lock(hashtextextended('connection_refresh:' || :workspace_id || ':'
                                              || :connection_id::text, 0)) IS NULL AS locked;

-- name: connection_store_pair :one
-- The refreshed pair, only over the generation it was refreshed from (a stale writer changes
-- nothing); the new generation, or no row.
UPDATE connections
SET access_sealed = :access_sealed, refresh_sealed = coalesce(:refresh_sealed, refresh_sealed),
    access_expires_at = now() + make_interval(secs => :expires_in),
    scopes = coalesce(:scopes, scopes), status = 'active', status_reason = '',
    token_generation = token_generation + 1, updated_at = now()
WHERE workspace_id = :workspace_id AND connection_id = :connection_id
  AND token_generation = :generation AND status = 'active'
RETURNING token_generation;

-- name: connection_set_status :one
-- A connection broke (revoked, needs_reauth, expired) or was revoked by its workspace; its
-- tokens are dropped when it is revoked. The row, if the status changed.
UPDATE connections
SET status = :status, status_reason = :reason, updated_at = now(),
    access_sealed = CASE WHEN :status = 'active' THEN access_sealed END,
    refresh_sealed = CASE WHEN :status = 'active' THEN refresh_sealed END
WHERE workspace_id = :workspace_id AND connection_id = :connection_id AND status <> :status
RETURNING connection_id, provider, account, owner, status;

-- name: connection_flow_insert :exec
-- An authorization in flight: the state's hash and the sealed PKCE verifier.
INSERT INTO connection_flows (state_sha256, workspace_id, flow_id, provider, owner, scopes,
                              verifier_sealed, connection_id, expires_at)
VALUES (:state_sha256, :workspace_id, :flow_id, :provider, :owner, :scopes, :verifier_sealed,
        :connection_id, now() + make_interval(secs => :ttl));

-- name: connection_flow_take :one
-- The flow a callback's state names, consumed (a state works once), if not expired.
DELETE FROM connection_flows WHERE state_sha256 = :state_sha256
RETURNING *, expires_at > now() AS live;

-- name: connection_wake_waiting :many
-- Every run parked on a connection becomes runnable now (reconnected).
UPDATE runs SET wake_at = now()
WHERE workspace_id = :workspace_id AND waiting_connection_id = :connection_id
  AND status = 'waiting' AND wake_at IS NULL
RETURNING run_id;

-- name: connection_find :one
-- The id of a workspace's connection to an account at a provider, if it has one.
SELECT connection_id FROM connections
WHERE workspace_id = :workspace_id AND provider = :provider AND account = :account;

-- name: connection_lock_timeout :exec
-- How long this transaction waits for a refresh lock another session holds.
SELECT set_config('lock_timeout', :timeout, true);

-- name: connection_lease_allows :one
-- Whether the run is running under this epoch and its agent version names the connection
-- (or `trigger`, and the run came in through it): the only case in which an executor is
-- handed the connection's token.
SELECT r.run_id FROM runs r
JOIN agent_versions v ON v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                    AND v.version = r.agent_version
WHERE r.workspace_id = :workspace_id AND r.run_id = :run_id AND r.status = 'running'
  AND r.lease_epoch = :epoch
  AND EXISTS (SELECT 1 FROM jsonb_each_text(coalesce(v.spec -> 'connections', '{}'::jsonb)) c
              WHERE c.value = :connection_id
                 -- `trigger`: the run's triggering account, recorded in its input step.
                 OR (c.value = 'trigger' AND EXISTS (
                     -- Named by the parameters, not the outer row: Citus takes no
                     -- correlated subquery beside a set-returning function.
                     SELECT 1 FROM steps i
                     WHERE i.workspace_id = :workspace_id AND i.run_id = :run_id AND i.seq = 0
                       AND i.payload ->> 'trigger_connection_id' = :connection_id)));

-- name: connection_mark_broken :one
-- A run parked on the connection: it needs its owner (needs_reauth unless already revoked
-- or expired). The row only the first time since it last worked: its owner is asked once.
UPDATE connections
SET status = CASE WHEN status = 'active' THEN 'needs_reauth' ELSE status END,
    status_reason = CASE WHEN status = 'active' THEN :reason ELSE status_reason END,
    notified_at = now(), updated_at = now()
WHERE workspace_id = :workspace_id AND connection_id = :connection_id AND notified_at IS NULL
RETURNING connection_id, provider, account, owner, status, scopes;

-- name: connection_mark_stale :exec
-- The provider refused the access token of generation :generation (401) before it was due:
-- make it due, so the next for_call refreshes it (single-flight). A newer generation (someone
-- refreshed meanwhile) is left alone.
UPDATE connections SET access_expires_at = now(), updated_at = now()
WHERE workspace_id = :workspace_id AND connection_id = :connection_id
  AND token_generation = :generation AND status = 'active';
