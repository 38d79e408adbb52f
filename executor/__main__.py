"""`python -m executor`: run one executor until SIGTERM or SIGINT, then drain and exit."""

from __future__ import annotations

import asyncio
import logging
import signal

from executor.config import ExecutorConfig
from executor.metrics import MetricsListener
from executor.worker import Worker
from telemetry import event_loop, logs, tracing

log = logging.getLogger("executor")


def main() -> None:
    """Entry point for `python -m executor` and `agentrun executor`."""
    logs.configure("executor")
    tracing.configure("agentrun-executor")
    # httpx logs every request with its URL at INFO: noise here, and a URL may carry secrets.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = ExecutorConfig.from_env()
    event_loop.run_server(_serve(config))


async def _serve(config: ExecutorConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    worker = Worker(config)

    def on_signal() -> None:
        # The first drains (turns finish); a second forces the drain (turns handed back).
        if stop.is_set():
            worker.force()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    log.info(
        "executor %s (release %s, capacity %d) serving control plane %s",
        config.executor_id,
        config.release,
        config.capacity,
        config.control_plane,
    )
    listener = MetricsListener.from_env()
    if listener is not None:
        await listener.start()
    try:
        await worker.run(stop)
    finally:
        if listener is not None:
            await listener.stop()
    log.info("executor %s stopped", config.executor_id)


if __name__ == "__main__":
    main()
