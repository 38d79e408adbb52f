"""Which tools exist, who can run them, and what they can do together.

Tools are known at publish time. Executors declare the tools they carry in
their Hello (name, version, schema hash, capabilities); the replica holding
the stream records the set in `executor_tools` and keeps it fresh, so every
replica sees the tool sets of the pools connected to any of them.

Tools are data (issue 18): the registry (store/tools.py, migrations/0024_tools.sql) holds
each workspace's own tools, versioned, beside the platform catalogue's shared entries
(builtins.py syncs them at start). definitions.py checks a definition when it is saved.
mcp_sync.py turns a remote MCP server's tools/list into registry proposals and a diff
(api/mcp_servers.py, store/mcp_servers.py, migrations/0025_mcp_servers.sql).

Publishing an agent version (guard.py) resolves spec.tools against the registry as the
workspace sees it (its own entries shadow shared ones), pins the latest version of each
(agent_versions.tool_versions) and refuses, with INVALID_ARGUMENT naming the entry of
spec.tools:

* a tool nobody knows (not in the workspace's registry, no connected pool declares it and
  the platform catalogue has no such entry);
* a built-in no connected pool serving the workspace can run, while some are connected;
* a set of built-ins that no single connected executor carries whole (no run of it could
  ever be assigned).

A workspace's own tools need no executor code: the dispatcher sends their pinned
definitions with each assignment (Assignment.tools) and any executor calls them. With no
executor serving the workspace connected at all (a fresh install, `make run` and tests
publish before executors start) the built-ins are checked against the platform catalogue
(`AGENTRUN_CATALOGUE`, else the one shipped with the executor) and the version is
published with a `no_executor` warning: its runs wait, queued, until an executor carrying
the tools comes.

The claim assigns a run only to an executor carrying every built-in of its agent version
(agent_versions.code_tools; lease.sql run_claim, `carried`). trifecta.py warns about
tool sets that together can be talked into exfiltrating data (the registry's capability
marks).
"""
