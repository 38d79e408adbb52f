"""gRPC core settings of agentrun's processes, applied before grpc loads.

`configure()` sets `GRPC_EXPERIMENTS` to EXPERIMENTS and `GRPC_ENABLE_FORK_SUPPORT` to
FORK_SUPPORT unless the environment sets them (an operator's value, an empty one included,
wins). It runs when `control_plane`, `executor`,
`agentrun_cli` or `bench` is first imported, and takes effect only if grpc was not loaded
before: gRPC reads its experiments once, when it initialises.

Why: grpcio 1.85 runs TCP on the PosixEventEngine by default (the `event_engine_client` and
`event_engine_listener` experiments, on since 1.6x), whose reads and writes happen on an
engine thread of their own and reach grpc.aio's poller thread, and then the event loop,
through further hand-offs. With both turned off, gRPC drives the socket from the poller
thread itself (the iomgr path, the default for years before). Measured here (uvloop, a 1 KB
message each way on one stream, 5,000 messages, three alternations): a round trip 256-290 us
against 170-198 us, and CPU per message and end 134-158 us against 95-110 us sent one at a
time, 63-77 against 47-59 us pipelined. A stream message is the executor's commit and the
control plane's answer (docs/scaling.md has what that does end to end).

Fork support off: no agentrun process uses gRPC in a forked child; every child it starts
execs a program (Postgres, Redis, a control plane, an executor, `cat`). With fork support on
(grpcio 1.85's default), a fork() while the process's channels are busy restarts gRPC's
poller in the child, which dies on the descriptors `close_fds` closed before it reaches the
exec (grpc/grpc#43055). Python forks rather than vforks when a child gets another user (the
embedded Postgres, started as `postgres` by a root process) or a `preexec_fn`. Measured
here, a `Popen` beside two threads making gRPC calls: 3-8 of 300-400 such children died
without running their program with fork support on, none of 1,100 with it off; CI lost a
restarted Postgres (tests/integration/test_durability.py) and an `agentrun dev` that way.

gRPC is removing these experiments (grpc/grpc#43350); a grpcio that no longer knows them
ignores the setting. grpcio is pinned in pyproject.toml: when it moves, measure again
(`python -m bench commit e2e`) and drop this if the engine's own path has caught up.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ENV = "GRPC_EXPERIMENTS"
EXPERIMENTS = "-event_engine_client,-event_engine_listener"
FORK_ENV = "GRPC_ENABLE_FORK_SUPPORT"
FORK_SUPPORT = "false"


def configure(environ: MutableMapping[str, str] | None = None) -> None:
    """Default `GRPC_EXPERIMENTS` to EXPERIMENTS and `GRPC_ENABLE_FORK_SUPPORT` to
    FORK_SUPPORT (see the module's docstring)."""
    env = os.environ if environ is None else environ
    env.setdefault(ENV, EXPERIMENTS)
    env.setdefault(FORK_ENV, FORK_SUPPORT)
