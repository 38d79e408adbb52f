"""Which key the CLI sends: AGENTRUN_API_KEY, else the profile's, else the dev stack's.

`agentrun dev` writes its credentials to `<data dir>/credentials.json`
(mode 0600); the CLI picks the admin key (the demo's approvals use the
approver key) from there, so the README's commands work as written. A profile
(`--profile`, AGENTRUN_PROFILE; agentrun_cli/profiles.py) comes between the two:
`activate` makes it this process's, once the arguments are parsed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc

from agentrun_cli.profiles import Profile
from executor.transport import ChannelSecurity

FILE_NAME = "credentials.json"
_active: Profile | None = None


def activate(profile: Profile | None) -> None:
    """Use `profile` (below the environment, above the dev credentials) from now on."""
    global _active
    _active = profile


def active() -> Profile | None:
    return _active


def dev_credentials(data_dir: Path | None = None) -> dict[str, Any]:
    """The dev stack's credentials file, or {} when there is none."""
    if data_dir is None:
        from agentrun_cli.stack import default_data_dir

        data_dir = default_data_dir()
    try:
        found = json.loads((data_dir / FILE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def api_key(role: str = "admin", data_dir: Path | None = None) -> str | None:
    """AGENTRUN_API_KEY, else the profile's key, else the dev credentials' `role` key, else None.

    A profile's key is the caller's one identity, whatever `role` the command would pick
    from the dev credentials.
    """
    if key := os.environ.get("AGENTRUN_API_KEY"):
        return key
    if _active is not None and (key := _active.key()):
        return key
    value = dev_credentials(data_dir).get(f"{role}_key")
    return value if isinstance(value, str) and value else None


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, key: str) -> None:
        self._pair = ("authorization", f"Bearer {key}")

    def _with_key(self, details: grpc.ClientCallDetails) -> _Details:
        return _Details(details, [*(details.metadata or ()), self._pair])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_key(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_key(details), request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_key(details), requests)


def channel(address: str, key: str | None) -> grpc.Channel:
    """A channel that sends `key` (when given) as `authorization: Bearer` on every call."""
    base = open_channel(address)
    return grpc.intercept_channel(base, _Bearer(key)) if key else base


def open_channel(address: str) -> grpc.Channel:
    """A channel to the control plane: TLS when `AGENTRUN_TLS_CA` (or the profile's `tls_ca`)
    names its trust roots.

    `AGENTRUN_TLS_SERVER_NAME` is the name its certificate must carry when that differs
    from the address's host (or the profile's `tls_server_name`).
    """
    # The executor's channel settings, read from the environment, else the profile.
    security = ChannelSecurity(
        ca=os.environ.get("AGENTRUN_TLS_CA") or (_active.tls_ca if _active else None),
        server_name=os.environ.get("AGENTRUN_TLS_SERVER_NAME")
        or (_active.tls_server_name if _active else None),
    )
    try:
        credentials = security.credentials()
    except ValueError as exc:  # an unreadable CA file: say which, and stop
        raise SystemExit(str(exc)) from None
    if credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials, options=security.options())
