-- Each call of a remote MCP server's tools has a deadline (issue 18): the server's, in
-- seconds (0: the platform default, AGENTRUN_TOOL_TIMEOUT_SECONDS), copied into its tools'
-- registry entries (definition.mcp.timeout_seconds) at every sync.
ALTER TABLE mcp_servers ADD COLUMN timeout_seconds double precision NOT NULL DEFAULT 0
    CONSTRAINT mcp_server_timeout_range CHECK (timeout_seconds >= 0 AND timeout_seconds <= 300);
