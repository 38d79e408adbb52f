-- name: tool_lock :exec
-- Serialise saves of one tool name in one workspace ($1, $2) until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended('tool:' || $1 || '/' || $2, 0));

-- name: tool_latest :one
-- The latest version of tool $2 of workspace $1 ('' : the shared entries).
SELECT workspace_id, name, version, definition, source, created_by, created_at
FROM tools WHERE workspace_id = $1 AND name = $2
ORDER BY version DESC LIMIT 1;

-- name: tool_insert :one
-- Save version $3 of tool $2 of workspace $1.
INSERT INTO tools (workspace_id, name, version, definition, source, created_by)
VALUES ($1, $2, $3, $4::jsonb, $5, $6)
RETURNING workspace_id, name, version, definition, source, created_by, created_at;

-- name: tool_get :one
-- Version $3 (0: the latest) of tool $2 as workspace $1 sees it: its own entry of that
-- name shadows a shared one ('' workspace), whatever their versions.
SELECT workspace_id, name, version, definition, source, created_by, created_at
FROM tools
WHERE workspace_id IN ($1, '') AND name = $2 AND ($3::int = 0 OR version = $3::int)
  AND workspace_id = (
      SELECT t.workspace_id FROM tools t WHERE t.workspace_id IN ($1, '') AND t.name = $2
      ORDER BY t.workspace_id DESC LIMIT 1)
ORDER BY version DESC LIMIT 1;

-- name: tool_list :many
-- The latest version of every tool workspace $1 sees (its own shadow shared ones of the
-- same name), by name, after the name $2 (NULL: from the start), at most $3. A tool whose
-- latest version is retired (its MCP server dropped it) is no longer offered: left out.
SELECT workspace_id, name, version, definition, source, created_by, created_at
FROM (
    SELECT DISTINCT ON (name) workspace_id, name, version, definition, source, created_by,
           created_at
    FROM tools
    WHERE workspace_id IN ($1, '') AND ($2::text IS NULL OR name > $2)
    ORDER BY name, workspace_id DESC, version DESC
) latest
WHERE NOT coalesce((definition ->> 'retired')::boolean, false)
ORDER BY name
LIMIT $3;

-- name: tool_pinned :many
-- The pinned versions ($2: names, $3: their owning workspaces, '' or $1, $4: versions)
-- of workspace $1's agent version: never another workspace's entries.
SELECT t.workspace_id, t.name, t.version, t.definition, t.source, t.created_by, t.created_at
FROM unnest($2::text[], $3::text[], $4::int[]) AS p(name, owner, version)
JOIN tools t ON t.name = p.name AND t.version = p.version AND t.workspace_id = p.owner
-- (t's filter repeats p's, so that Citus reads two shards, the workspace's and the shared one.)
WHERE p.owner IN ($1, '') AND t.workspace_id IN ($1, '')
ORDER BY t.name;
