-- Guardrails (issue 12): the tools each connected executor carries, so that
-- publishing an agent version with a tool nobody can run is refused on every
-- replica, not only on the one holding the executor's stream.
--
-- One row per connected executor (its id is stable for the process's life),
-- written when its Hello arrives and refreshed by the replica holding its
-- stream every heartbeat interval; a clean disconnect deletes it. A row is
-- live while last_seen is recent (a few lease durations,
-- control_plane/tools/registry.py): an executor killed -9 stops counting
-- once its row goes stale, without anyone cleaning up. Not a tenant table:
-- executors are the platform's; `scope` is the workspaces its credential
-- serves (NULL: all).
CREATE TABLE executor_tools (
    executor_id  text PRIMARY KEY,
    -- The stream (ExecutorSession.id) that wrote the row: a disconnect deletes
    -- only its own row, never one a reconnect to another replica wrote since.
    session_id   text NOT NULL,
    release      text NOT NULL DEFAULT '',
    scope        text[],
    -- [{"name", "version", "schema_sha256", "capabilities": [...]}, ...]
    tools        jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(tools) = 'array'),
    connected_at timestamptz NOT NULL DEFAULT now(),
    last_seen    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX executor_tools_live ON executor_tools (last_seen);
