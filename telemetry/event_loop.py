"""The event loop the control plane and the executors run on: uvloop where it is installed.

Profiles (issue 16) put a quarter of the executor's CPU in asyncio's own machinery; uvloop's
libuv loop does the same work for less. `AGENTRUN_EVENT_LOOP=asyncio` keeps the standard
library's loop (to compare, or to rule uvloop out); `uvloop` insists on it; unset picks
uvloop when it can be imported and asyncio otherwise. Both loops run grpc.aio, asyncpg,
redis and httpx alike; nothing else in the code depends on which one it is.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

ENV = "AGENTRUN_EVENT_LOOP"
CHOICES = ("asyncio", "uvloop")

T = TypeVar("T")


def chosen(environ: dict[str, str] | None = None) -> str:
    """The loop `AGENTRUN_EVENT_LOOP` asks for (default: uvloop where importable)."""
    value = (environ if environ is not None else os.environ).get(ENV, "").strip().lower()
    if not value:
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    if value not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, not {value!r}")
    return value


def _factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "asyncio":
        return None
    import uvloop  # only when chosen: `asyncio` must work without it installed

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the chosen loop, saying which in the log."""
    try:
        name = chosen()
    except ValueError:
        main.close()  # never started: no "coroutine was never awaited" warning on top
        raise
    log.info("event loop: %s", name)
    with asyncio.Runner(loop_factory=_factory(name)) as runner:
        return runner.run(main)


# The youngest generation is collected after this many more allocations than frees of
# tracked objects (CPython's default: 700).
GEN0_THRESHOLD = 10_000


def run_server(main: Coroutine[Any, Any, T]) -> T:
    """`run(main)` for a long-lived server process (the control plane, an executor), after
    `collect_less()`. Only their entry points call it: the collector's settings are the
    whole process's, and a benchmark or a test running a loop must keep the defaults."""
    collect_less()
    return run(main)


def collect_less() -> None:
    """Fewer, cheaper garbage collections for a long-lived server: what was allocated by now
    (modules, classes, protobuf descriptors: nearly all the heap) is frozen out of every
    collection, and the youngest generation is collected less often. Every message and
    request allocates; with the defaults the collector was 3-4 % of both processes' CPU."""
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
