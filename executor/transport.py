"""How the executor's channel to the control plane is secured: plaintext, TLS, or mutual TLS.

* `AGENTRUN_TLS_CA`: PEM trust roots that verify the control plane's certificate; setting
  it turns TLS on (a system bundle such as /etc/ssl/certs/ca-certificates.crt works too).
* `AGENTRUN_TLS_CLIENT_CERT` / `AGENTRUN_TLS_CLIENT_KEY`: this executor's certificate and
  key, presented in the handshake (mutual TLS); also turns TLS on (with grpc's default
  roots when no CA is given).
* `AGENTRUN_TLS_SERVER_NAME`: the name to verify the control plane's certificate against
  when it differs from the host in `AGENTRUN_CONTROL_PLANE`.

Nothing set: plaintext, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from telemetry import grpc_trace


@dataclass(frozen=True)
class ChannelSecurity:
    ca: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ChannelSecurity:
        security = cls(
            ca=env.get("AGENTRUN_TLS_CA") or None,
            client_cert=env.get("AGENTRUN_TLS_CLIENT_CERT") or None,
            client_key=env.get("AGENTRUN_TLS_CLIENT_KEY") or None,
            server_name=env.get("AGENTRUN_TLS_SERVER_NAME") or None,
        )
        if bool(security.client_cert) != bool(security.client_key):
            raise ValueError(
                "AGENTRUN_TLS_CLIENT_CERT and AGENTRUN_TLS_CLIENT_KEY are set together or not at all"
            )
        return security

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.client_cert)

    def credentials(self) -> grpc.ChannelCredentials | None:
        """The channel credentials (files read now), or None for plaintext."""
        if not self.enabled:
            return None
        roots = _read(self.ca, "AGENTRUN_TLS_CA") if self.ca else None
        if self.client_cert and self.client_key:
            return grpc.ssl_channel_credentials(
                root_certificates=roots,
                private_key=_read(self.client_key, "AGENTRUN_TLS_CLIENT_KEY"),
                certificate_chain=_read(self.client_cert, "AGENTRUN_TLS_CLIENT_CERT"),
            )
        return grpc.ssl_channel_credentials(root_certificates=roots)

    def options(self) -> list[tuple[str, str]]:
        """Channel options TLS needs: the certificate name override, when set."""
        if self.enabled and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


def _read(path: str, variable: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{variable}: cannot read {path}: {exc.strerror}") from None


def open_channel(
    target: str,
    options: Sequence[tuple[str, int | str]],
    credentials: grpc.ChannelCredentials | None,
) -> grpc.aio.Channel:
    """A secure channel when there are credentials, else a plaintext one."""
    # Unary calls carry the caller's trace context (telemetry/grpc_trace.py).
    interceptors = grpc_trace.client_interceptors() or None
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(
        target, credentials, options=list(options), interceptors=interceptors
    )
