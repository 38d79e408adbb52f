-- Remote MCP servers (issue 18): a workspace registers a server's streamable HTTP endpoint and
-- the connection that authenticates to it (a provider name, '' for none: the token is fetched
-- from the connections store when the server is asked, never stored here). Its tools/list is
-- snapshotted into the tool registry (tools, source 'mcp', definition.mcp.server_id naming
-- the server); `last_sync_at` is when that last happened.
CREATE TABLE mcp_servers (
    workspace_id text NOT NULL REFERENCES workspaces,
    server_id    text NOT NULL CONSTRAINT mcp_server_id_shape CHECK (server_id ~ '^[a-z][a-z0-9_-]{0,62}$'),
    url          text NOT NULL CONSTRAINT mcp_server_url_shape CHECK (url ~ '^https?://' AND length(url) <= 2048),
    connection   text NOT NULL DEFAULT '',
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_sync_at timestamptz,
    PRIMARY KEY (workspace_id, server_id)
);
