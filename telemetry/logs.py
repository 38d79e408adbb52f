"""Structured logs: stdlib `logging` calls rendered by structlog as one JSON object a line.

Every module keeps its `log = logging.getLogger(__name__)` and `log.info("... %s", x)`
calls; the root handler's `structlog.stdlib.ProcessorFormatter` renders them, adding
the context bound with `bound(workspace=..., run=..., epoch=...)` (contextvars, so an
asyncio task sees what was bound when it was created and what it binds itself), the
current trace and span ids, the level, the logger and an ISO timestamp.

`AGENTRUN_LOG_LEVEL` (case-insensitive: debug, info, warning, error) sets the level;
`AGENTRUN_LOG_FORMAT=console` renders aligned key=value lines for people instead of JSON.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import structlog
from opentelemetry import trace

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("json", "console")

Processor = Any  # structlog's processor type is a broad callable alias


def level_from_env(env: Mapping[str, str] | None = None, default: str = "INFO") -> int:
    """`AGENTRUN_LOG_LEVEL`, any case; an unknown name stops the process with the choices."""
    raw = (env if env is not None else os.environ).get("AGENTRUN_LOG_LEVEL") or default
    name = raw.strip().upper()
    if name == "WARN":
        name = "WARNING"
    if name not in LEVELS:
        raise SystemExit(f"AGENTRUN_LOG_LEVEL={raw!r} is not one of {', '.join(LEVELS).lower()}")
    return int(logging.getLevelName(name))


def _format_from_env(env: Mapping[str, str]) -> str:
    raw = (env.get("AGENTRUN_LOG_FORMAT") or "json").strip().lower()
    if raw not in FORMATS:
        raise SystemExit(f"AGENTRUN_LOG_FORMAT={raw!r} is not one of {', '.join(FORMATS)}")
    return raw


def add_trace_ids(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The current span's trace and span ids, so a log line joins its trace."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    return event


def _shared(service: str, extra: Sequence[Processor]) -> list[Processor]:
    def add_service(
        logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event.setdefault("service", service)
        return event

    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_service,
        add_trace_ids,
        *extra,
    ]


def configure(
    service: str,
    *,
    extra: Sequence[Processor] = (),
    env: Mapping[str, str] | None = None,
    stream: Any = None,
) -> None:
    """Route every stdlib log record (ours and libraries') through structlog to `stream`.

    `extra` are processors of the caller's own context (the control plane adds the
    request id); they must never add a credential.
    """
    env = os.environ if env is None else env
    shared = _shared(service, extra)
    fmt = _format_from_env(env)
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *shared],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if fmt == "json" else _keep,
            # "message", as log platforms (and OpenTelemetry's log model) name it.
            structlog.processors.EventRenamer("message") if fmt == "json" else _keep,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_from_env(env))
    # Loggers of our own made with structlog.get_logger() go the same way.
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def _keep(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return event


@contextlib.contextmanager
def bound(**values: Any) -> Iterator[None]:
    """Add `values` (workspace, run, epoch, request id…) to every log line inside the block.

    The context variables' own tokens restore what was bound before: structlog's
    bound_contextvars reads every context variable of the context to save it first, on
    every commit and every hold."""
    tokens = structlog.contextvars.bind_contextvars(**values)
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def bind_for_task(**values: Any) -> None:
    """`bound` for the rest of a task of its own (asyncio.create_task ran it in a copy of the
    context, which ends with it): nothing to reset, so cheaper on a per-message path."""
    structlog.contextvars.bind_contextvars(**values)


__all__ = ["bind_for_task", "bound", "configure", "level_from_env"]
