"""The `agentrun` command: API client commands, server entry points and the local dev stack."""
