"""Benchmarks: figures and ratios measured side by side in one run (`python -m bench`)."""

import os

# gRPC's fork notices ("Other threads are currently calling into gRPC, skipping fork()
# handlers") are printed each time a benchmark starts a process while its channels are open.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from telemetry import grpc_core  # noqa: E402 - after the settings above, as they are

# The benchmark's own channels and its bare gRPC floor run as agentrun's processes do.
grpc_core.configure()
