-- name: api_key_insert :one
-- Store a new key: its id and the SHA-256 of its secret, never the secret.
INSERT INTO api_keys (key_id, kind, workspace_id, role, principal, scope, secret_sha256,
                      created_by, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, coalesce($10::timestamptz, now()), $9)
RETURNING key_id, kind, workspace_id, role, principal, scope, created_by, created_at,
          expires_at, revoked_at;

-- name: api_key_lookup :one
-- A key by id, with its hash, if it is neither revoked nor expired (at the
-- database clock unless $2 fixes it).
SELECT key_id, kind, workspace_id, role, principal, scope, secret_sha256, expires_at
FROM api_keys
WHERE key_id = $1 AND revoked_at IS NULL
  AND (expires_at IS NULL OR expires_at > coalesce($2::timestamptz, now()));

-- name: api_key_get :one
-- A key's listing row (never the hash).
SELECT key_id, kind, workspace_id, role, principal, scope, created_by, created_at,
       expires_at, revoked_at
FROM api_keys WHERE key_id = $1;

-- name: api_key_list :many
-- A page of keys (never their hashes): a workspace's ($1), or the platform's
-- executor and platform keys when $1 is NULL; oldest first after key $2.
SELECT key_id, kind, workspace_id, role, principal, scope, created_by, created_at,
       expires_at, revoked_at
FROM api_keys
WHERE workspace_id IS NOT DISTINCT FROM $1::text
  AND ($2::text IS NULL OR key_id > $2)
ORDER BY key_id
LIMIT $3;

-- name: api_key_revoke :one
-- Revoke a key of workspace $2 (NULL: a platform-level key), once. Nothing
-- when there is no such key or it was revoked already.
UPDATE api_keys SET revoked_at = coalesce($3::timestamptz, now())
WHERE key_id = $1 AND workspace_id IS NOT DISTINCT FROM $2::text AND revoked_at IS NULL
RETURNING key_id, kind, workspace_id, role, principal, scope, created_by, created_at,
          expires_at, revoked_at;

-- name: member_upsert :one
-- Give a person a role in a workspace (a new member, or a changed role).
INSERT INTO workspace_members (workspace_id, person, role, added_by)
VALUES ($1, $2, $3, $4)
ON CONFLICT (workspace_id, person) DO UPDATE SET role = excluded.role
RETURNING workspace_id, person, role, added_by, added_at;

-- name: member_delete :one
-- Remove a person from a workspace; nothing when they were not a member.
DELETE FROM workspace_members WHERE workspace_id = $1 AND person = $2
RETURNING workspace_id, person, role, added_by, added_at;

-- name: member_list :many
-- A page of a workspace's members, by email, after $2.
SELECT workspace_id, person, role, added_by, added_at FROM workspace_members
WHERE workspace_id = $1 AND ($2::text IS NULL OR person > $2)
ORDER BY person
LIMIT $3;

-- name: member_role :one
-- A signed-in person's role in a workspace (nothing: not a member).
SELECT role FROM workspace_members WHERE workspace_id = $1 AND person = $2;

-- name: audit_append :one
-- Record a privileged write; run it in the write's own transaction.
INSERT INTO audit_log (workspace_id, actor, action, object_kind, object_id, request_id, detail,
                       at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, coalesce($8::timestamptz, now()))
RETURNING workspace_id, audit_id, at, actor, action, object_kind, object_id, request_id,
          detail;

-- name: audit_list :many
-- A page of a workspace's audit log, newest first, before audit_id $2.
SELECT workspace_id, audit_id, at, actor, action, object_kind, object_id, request_id, detail
FROM audit_log
WHERE workspace_id = $1 AND ($2::bigint IS NULL OR audit_id < $2)
ORDER BY audit_id DESC
LIMIT $3;

-- name: workspace_create :one
-- Create a workspace on a plan (its cap the plan's unless $3 gives one).
-- Nothing when it exists already or the plan does not.
-- (The running count is read by a subquery here, not workspace_running(): on Citus
-- the statement runs on the shard, where a function reading a distributed table is
-- refused.)
WITH created AS (
    INSERT INTO workspaces (workspace_id, plan, max_concurrency)
    SELECT $1, p.plan, coalesce($3::int, p.max_concurrency) FROM plans p WHERE p.plan = $2
    ON CONFLICT (workspace_id) DO NOTHING
    RETURNING workspace_id, plan, max_concurrency, created_at
)
SELECT workspace_id, plan, max_concurrency,
       (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
        WHERE c.workspace_id = $1) AS running,
       created_at
FROM created;
