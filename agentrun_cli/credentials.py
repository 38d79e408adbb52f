"""Which key the CLI sends: AGENTRUN_API_KEY, else the profile's, else the dev stack's.

`agentrun dev` writes its credentials to `<data dir>/credentials.json`
(mode 0600); the CLI picks the admin key (the demo's approvals use the
approver key) from there, so the README's commands work as written. A profile
(`--profile`, AGENTRUN_PROFILE; agentrun_client/profiles.py) comes between the two:
`activate` makes it this process's, once the arguments are parsed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from agentrun_client import config
from agentrun_client.profiles import Profile

FILE_NAME = config.CREDENTIALS_FILE
_active: Profile | None = None


def activate(profile: Profile | None) -> None:
    """Use `profile` (below the environment, above the dev credentials) from now on."""
    global _active
    _active = profile


def active() -> Profile | None:
    return _active


def _data_dir(data_dir: Path | None) -> Path:
    if data_dir is None:
        from agentrun_cli.stack import default_data_dir

        data_dir = default_data_dir()
    return data_dir


def dev_credentials(data_dir: Path | None = None) -> dict[str, Any]:
    """The dev stack's credentials file, or {} when there is none."""
    return config.dev_credentials(_data_dir(data_dir))


def api_key(role: str = "admin", data_dir: Path | None = None) -> str | None:
    """AGENTRUN_API_KEY, else the profile's key, else the dev credentials' `role` key, else None.

    A profile's key is the caller's one identity, whatever `role` the command would pick
    from the dev credentials (agentrun_client.config.resolve_key).
    """
    return config.resolve_key(_active, role, _data_dir(data_dir))


def settings(address: str, key: str | None) -> config.Settings:
    """The client package's settings for `address` and `key`, TLS from the environment or
    the active profile."""
    return config.Settings(address=address, api_key=key, tls=config.tls_settings(_active))


def channel(address: str, key: str | None) -> grpc.Channel:
    """A channel that sends `key` (when given) as `authorization: Bearer` on every call:
    agentrun_client's, TLS when `AGENTRUN_TLS_CA` (or the profile's `tls_ca`) names its trust
    roots (`AGENTRUN_TLS_SERVER_NAME`: the name its certificate carries when that differs from
    the address's host)."""
    try:
        return config.sync_channel(settings(address, key))
    except ValueError as exc:  # an unreadable CA file: say which, and stop
        raise SystemExit(str(exc)) from None


def open_channel(address: str) -> grpc.Channel:
    """A channel to the control plane without a key (TLS as `channel` has it)."""
    return channel(address, None)
