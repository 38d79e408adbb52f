"""Tools: what exists, how to send it, and how an unknown outcome is settled.

catalogue   the integration catalogue (catalogue.json): schemas, classes, providers
keys        idempotency keys (run_id:seq) and their expiry per provider
http_tool   the HTTP requests: a call, its key stamp, a lookup
send_errors how a request failed: not sent, maybe sent, the provider's error status
rejection   a call refused before it was started (unknown tool, bad arguments)
failures    whether a failed request may have reached the provider
delivery    retries and resolution by class: ok, error, unknown (a person decides), pending
definitions a run's tool set: the built-ins plus its workspace's registry tools (Assignment.tools)
template    a registry HTTP tool's call as one request (escaping, headers, query, body, pointer)
transport   where a registry MCP tool's call goes (call_mcp -> mcp_call.call)
mcp_call    one MCP tool call as a short streamable HTTP session, its failures classified
(where a workspace's tool may connect is ground/netguard.py, shared with the control plane)
"""
