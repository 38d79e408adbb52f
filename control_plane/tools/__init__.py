"""Which tools exist, who can run them, and what they can do together.

Tools are known at publish time. Executors declare the tools they carry in
their Hello (name, version, schema hash, capabilities); the replica holding
the stream records the set in `executor_tools` and keeps it fresh, so every
replica sees the tool sets of the pools connected to any of them.

Publishing an agent version (registry.check) then refuses, with
INVALID_ARGUMENT naming the entry of spec.tools:

* a tool nobody knows (no connected pool declares it and the platform
  catalogue has no such entry);
* a tool no connected pool serving the workspace can run, while some are
  connected;
* a set that no single connected executor carries whole (no run of it could
  ever be assigned).

With no executor serving the workspace connected at all (a fresh install,
`make run` and tests publish before executors start) the tools are checked
against the platform catalogue (`AGENTRUN_CATALOGUE`, else the one shipped
with the executor) and the version is published with a `no_executor`
warning: its runs wait, queued, until an executor carrying the tools comes.

The claim assigns a run only to an executor carrying every tool of its agent
version (lease.sql run_claim_due, `carried`). trifecta.py warns about tool
sets that together can be talked into exfiltrating data.
"""
