"""The `agentrun` command: API client commands, server entry points and the local dev stack."""

from telemetry import grpc_core

grpc_core.configure()  # before anything here loads grpc (telemetry/grpc_core.py says why)
