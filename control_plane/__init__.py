"""The control plane: runs, leases and the executor streams, in Postgres, served over gRPC."""

from telemetry import grpc_core

grpc_core.configure()  # before anything here loads grpc (telemetry/grpc_core.py says why)
