"""Where the control plane is and which key to send: the same settings as the `agentrun` CLI.

Precedence, for each setting: an argument > the environment (AGENTRUN_ADDRESS,
AGENTRUN_WORKSPACE, AGENTRUN_API_KEY, AGENTRUN_TLS_CA, AGENTRUN_TLS_SERVER_NAME,
AGENTRUN_TLS_CLIENT_CERT/KEY) > the profile (`profile=`, else AGENTRUN_PROFILE, else the
config file's `default`; agentrun_client/profiles.py) > a running `agentrun dev` (its data
dir's `run/control-plane.port` and `credentials.json`) > `127.0.0.1:50051`, workspace
`default`.

The dev stack's data dir is AGENTRUN_DATA_DIR, else `.data` in the current directory (where
`agentrun dev` keeps it when started from a checkout).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agentrun_client import profiles
from agentrun_client.profiles import Profile

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_WORKSPACE = "default"
CREDENTIALS_FILE = "credentials.json"
PORT_FILE = Path("run") / "control-plane.port"


def default_data_dir() -> Path:
    """AGENTRUN_DATA_DIR, else `./.data`."""
    return Path(os.environ.get("AGENTRUN_DATA_DIR") or Path.cwd() / ".data")


def dev_credentials(data_dir: Path | None = None) -> dict[str, Any]:
    """The dev stack's credentials file, or {} when there is none."""
    try:
        found = json.loads(((data_dir or default_data_dir()) / CREDENTIALS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def dev_key(role: str = "admin", data_dir: Path | None = None) -> str | None:
    """The dev stack's key for `role` (admin, approver, operator, platform...), or None."""
    value = dev_credentials(data_dir).get(f"{role}_key")
    return value if isinstance(value, str) and value else None


def recorded_address(data_dir: Path | None = None) -> tuple[str, Path] | None:
    """Where the dev stack of `data_dir` serves gRPC and the file that says so; None when no
    stack of that data dir is up (it removes the file when it stops)."""
    path = (data_dir or default_data_dir()) / PORT_FILE
    port = read_port_file(path)
    return (f"127.0.0.1:{port}", path) if port else None


def read_port_file(path: Path) -> int | None:
    """The port in a file `agentrun dev` wrote (`port` or `host:port`), or None."""
    try:
        return int(path.read_text().strip().rsplit(":", 1)[-1])
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Tls:
    """TLS to the control plane: trust roots, an optional client certificate, the name the
    server's certificate carries when it differs from the address's host."""

    ca: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.client_cert)

    def credentials(self) -> grpc.ChannelCredentials | None:
        """The channel credentials (files read now), or None for plaintext; ValueError naming
        the file that cannot be read."""
        if not self.enabled:
            return None
        if bool(self.client_cert) != bool(self.client_key):
            raise ValueError("AGENTRUN_TLS_CLIENT_CERT and AGENTRUN_TLS_CLIENT_KEY go together")
        roots = _read(self.ca, "AGENTRUN_TLS_CA") if self.ca else None
        if self.client_cert and self.client_key:
            return grpc.ssl_channel_credentials(
                root_certificates=roots,
                private_key=_read(self.client_key, "AGENTRUN_TLS_CLIENT_KEY"),
                certificate_chain=_read(self.client_cert, "AGENTRUN_TLS_CLIENT_CERT"),
            )
        return grpc.ssl_channel_credentials(root_certificates=roots)

    def options(self) -> list[tuple[str, str]]:
        if self.enabled and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


def _read(path: str, variable: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ValueError(f"{variable}: cannot read {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class Settings:
    """A resolved connection: address, workspace, key and TLS, and where the address came
    from (for error messages)."""

    address: str = DEFAULT_ADDRESS
    workspace: str = DEFAULT_WORKSPACE
    api_key: str | None = field(default=None, repr=False)
    tls: Tls = field(default_factory=Tls)
    address_from: str = "the default"

    @classmethod
    def resolve(
        cls,
        address: str | None = None,
        workspace: str | None = None,
        api_key: str | None = None,
        *,
        profile: str | Profile | None = None,
        role: str = "admin",
        data_dir: Path | None = None,
    ) -> Settings:
        """The settings, by the CLI's precedence. `role`: which of a dev stack's keys to use
        when nothing else names one (approver keys decide approvals)."""
        chosen = profile if isinstance(profile, Profile) else profiles.select(profile)
        found_address, source = resolve_address(address, chosen, data_dir)
        return cls(
            address=found_address,
            workspace=resolve_workspace(workspace, chosen),
            api_key=api_key or resolve_key(chosen, role, data_dir),
            tls=tls_settings(chosen),
            address_from=source,
        )


def resolve_address(
    given: str | None,
    profile: Profile | None,
    data_dir: Path | None = None,
    *,
    dev_stack: bool = True,
) -> tuple[str, str]:
    """The address and where it came from (for errors): `given`, AGENTRUN_ADDRESS, the
    profile's, then (with `dev_stack`) the port the dev stack of `data_dir` recorded
    (`agentrun dev` binds another port when 50051 is taken), else the default."""
    if given:
        return given, "the address given"
    if env := os.environ.get("AGENTRUN_ADDRESS"):
        return env, "AGENTRUN_ADDRESS"
    if profile is not None and profile.address:
        return profile.address, f"profile {profile.name!r}"
    if not dev_stack:
        return DEFAULT_ADDRESS, "the default"
    data_dir = data_dir or default_data_dir()
    if recorded := recorded_address(data_dir):
        where = f"run/{recorded[1].name}"
        return recorded[0], f"where `agentrun dev` with data dir {data_dir} listens, per {where}"
    return DEFAULT_ADDRESS, f"the default; no `agentrun dev` with data dir {data_dir} is running"


def resolve_workspace(given: str | None, profile: Profile | None) -> str:
    """`given`, AGENTRUN_WORKSPACE, the profile's, else `default`."""
    return (
        given
        or os.environ.get("AGENTRUN_WORKSPACE")
        or (profile.workspace if profile else None)
        or DEFAULT_WORKSPACE
    )


def resolve_key(
    profile: Profile | None, role: str = "admin", data_dir: Path | None = None
) -> str | None:
    """AGENTRUN_API_KEY, else the profile's key, else the dev stack's `role` key, else None.

    A profile's key is the caller's one identity, whatever `role` would pick from the dev
    credentials."""
    if key := os.environ.get("AGENTRUN_API_KEY"):
        return key
    if profile is not None and (key := profile.key()):
        return key
    return dev_key(role, data_dir)


def tls_settings(profile: Profile | None) -> Tls:
    """TLS from the environment, else the profile (plaintext when neither names a CA)."""
    env = os.environ.get
    return Tls(
        ca=env("AGENTRUN_TLS_CA") or (profile.tls_ca if profile else None),
        client_cert=env("AGENTRUN_TLS_CLIENT_CERT") or None,
        client_key=env("AGENTRUN_TLS_CLIENT_KEY") or None,
        server_name=env("AGENTRUN_TLS_SERVER_NAME")
        or (profile.tls_server_name if profile else None),
    )


# --- channels ---------------------------------------------------------------------------------


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
    """Sends the key as `authorization: Bearer` on every call of a sync channel."""

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


class _AioBearer:
    """The same for an asyncio channel: one interceptor object per kind of call, since
    grpc.aio files an interceptor under the first kind it implements only."""

    def __init__(self, key: str) -> None:
        self._pair = ("authorization", f"Bearer {key}")

    def _with_key(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._pair)
        return details._replace(metadata=metadata)


class _AioUnaryBearer(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_key(details), request)


class _AioStreamBearer(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_key(details), request)


def sync_channel(settings: Settings, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel that sends the settings' key (when there is one) on every call."""
    creds = settings.tls.credentials()
    opts = [*options, *settings.tls.options()]
    if creds is None:
        base = grpc.insecure_channel(settings.address, options=opts)
    else:
        base = grpc.secure_channel(settings.address, creds, options=opts)
    return grpc.intercept_channel(base, _Bearer(settings.api_key)) if settings.api_key else base


def aio_channel(settings: Settings, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An asyncio channel that sends the settings' key (when there is one) on every call."""
    creds = settings.tls.credentials()
    opts = [*options, *settings.tls.options()]
    key = settings.api_key
    interceptors: list[Any] | None = [_AioUnaryBearer(key), _AioStreamBearer(key)] if key else None
    if creds is None:
        return grpc.aio.insecure_channel(settings.address, opts, interceptors=interceptors)
    return grpc.aio.secure_channel(settings.address, creds, opts, interceptors=interceptors)
