"""Benchmarks: figures and ratios measured side by side in one run (`python -m bench`)."""

import os

# gRPC's fork notices ("Other threads are currently calling into gRPC, skipping fork()
# handlers") are printed each time a benchmark starts a process while its channels are open.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
