-- Private sessions (migration 0051, control_plane/auth/privacy.py): who sees a session, its
-- turns' runs and their events. A reader is a principal's label; NULL is one who sees
-- everything (a workspace admin, or the platform itself). Every statement names the
-- workspace ($1) in each table it reads, so a Citus coordinator routes it to one shard.

-- name: run_visible :fragment
-- Whether run row @1 (its alias) of workspace @2 may be seen by reader @3 (NULL: sees
-- everything): it is no private session's (runs.session_id: a turn and all below it,
-- migration 0053), or the reader is a member of that session. Every list of runs a reader
-- reads and privacy_run_hidden include it.
(@3::text IS NULL OR @1.session_id IS NULL
 OR NOT EXISTS (SELECT 1 FROM sessions x
                WHERE x.workspace_id = @2 AND x.session_id = @1.session_id
                  AND x.visibility = 'private'
                  AND NOT EXISTS (SELECT 1 FROM session_members m
                                  WHERE m.workspace_id = @2 AND m.session_id = x.session_id
                                    AND m.member = @3)))

-- name: privacy_session_hidden :one
-- Whether session $2 is private and reader $3 is not one of its members (no row: no
-- such session).
SELECT (x.visibility = 'private' AND $3::text IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM session_members m
                        WHERE m.workspace_id = $1 AND m.session_id = x.session_id
                          AND m.member = $3)) AS hidden
FROM sessions x WHERE x.workspace_id = $1 AND x.session_id = $2;

-- name: privacy_run_hidden :one
-- Whether run $2 belongs to a private session (a turn, or anything below one: runs.session_id,
-- migration 0053) that reader $3 is not a member of.
SELECT EXISTS (
    SELECT 1 FROM runs r
    WHERE r.workspace_id = $1 AND r.run_id = $2 AND r.session_id IS NOT NULL
      AND NOT {{run_visible(r, $1, $3)}}
) AS hidden;

-- name: session_members_add :exec
-- Add members $3 (labels) to session $2, added by $4; one already there stays as it was.
INSERT INTO session_members (workspace_id, session_id, member, added_by)
SELECT $1, $2, m, $4 FROM unnest($3::text[]) AS m
ON CONFLICT DO NOTHING;

-- name: session_members_remove :exec
-- Remove members $3 from session $2.
DELETE FROM session_members
WHERE workspace_id = $1 AND session_id = $2 AND member = ANY($3::text[]);

-- name: session_visibility_set :exec
-- Make session $2 'workspace' or 'private' ($3).
UPDATE sessions SET visibility = $3, updated_at = now()
WHERE workspace_id = $1 AND session_id = $2;

-- name: session_members_of :one
-- Session $2's members, sorted.
SELECT coalesce(array_agg(member ORDER BY member), '{}') AS members FROM session_members
WHERE workspace_id = $1 AND session_id = $2;
