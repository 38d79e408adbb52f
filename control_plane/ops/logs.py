"""The control plane's logs: JSON lines through structlog (telemetry/logs.py), with the
request id of the call being served (`x-request-id`, or the one the interceptor made)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from control_plane.auth import audit
from telemetry import logs


def add_request_id(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    if request_id := audit.current_request_id():
        event.setdefault("request_id", request_id)
    return event


def configure() -> None:
    """Logs of `agentrun server` / `python -m control_plane` (AGENTRUN_LOG_LEVEL, _FORMAT)."""
    logs.configure("control-plane", extra=[add_request_id])
