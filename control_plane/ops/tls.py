"""Transport security of the control plane's listeners: which port speaks TLS, which asks for
client certificates.

With `AGENTRUN_TLS_CERT` and `AGENTRUN_TLS_KEY` every listener (public gRPC, executor gRPC,
HTTP ingress) serves TLS only; a plaintext client fails its handshake. grpc lets a port
either *require* a client certificate or not ask for one at all (there is no "ask, but
accept a client without one"), so client certificates are a property of a port:

* the public API never asks for one (API-key and signed-in clients have none);
* the executor listener (`AGENTRUN_EXECUTOR_LISTEN`) requires one signed by
  `AGENTRUN_TLS_CLIENT_CA` when that is set, and its verified identity can then stand
  in for an executor key (control_plane/auth/mtls.py).

So a client CA needs an executor listener of its own; `check_transport` refuses it otherwise rather
than silently never asking for the certificates.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from control_plane.ground.config import ServerConfig


def check_transport(config: ServerConfig) -> None:
    """Refuse settings that would serve less security than they ask for."""
    if bool(config.tls_cert) != bool(config.tls_key):
        raise SystemExit("AGENTRUN_TLS_CERT and AGENTRUN_TLS_KEY are set together or not at all")
    if config.tls_client_ca and not config.tls_cert:
        raise SystemExit("AGENTRUN_TLS_CLIENT_CA needs AGENTRUN_TLS_CERT and AGENTRUN_TLS_KEY")
    if config.tls_client_ca and not config.executor_listen:
        raise SystemExit(
            "AGENTRUN_TLS_CLIENT_CA needs AGENTRUN_EXECUTOR_LISTEN: client certificates are "
            "required on the executor listener, and the public API cannot require them"
        )


def _read(path: str, variable: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SystemExit(f"{variable}: cannot read {path}: {exc.strerror}") from None


def server_credentials(config: ServerConfig, *, executor: bool) -> grpc.ServerCredentials | None:
    """The credentials of a gRPC port, or None for plaintext (no certificate configured).

    `executor` marks the executor's own listener: it requires client certificates signed
    by the client CA when one is configured.
    """
    if not config.tls_cert or not config.tls_key:
        return None
    pair = (_read(config.tls_key, "AGENTRUN_TLS_KEY"), _read(config.tls_cert, "AGENTRUN_TLS_CERT"))
    if executor and config.tls_client_ca:
        return grpc.ssl_server_credentials(
            [pair],
            root_certificates=_read(config.tls_client_ca, "AGENTRUN_TLS_CLIENT_CA"),
            require_client_auth=True,
        )
    return grpc.ssl_server_credentials([pair])


def add_port(
    server: grpc.aio.Server, listen: str, credentials: grpc.ServerCredentials | None
) -> int:
    """Bind `listen` (TLS when `credentials`), returning the port; exits when it cannot."""
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise SystemExit(f"cannot listen on {listen}")
    return port


def http_files(config: ServerConfig) -> tuple[str, str] | None:
    """(certificate, key) for the HTTP ingress, or None for plaintext."""
    if config.tls_cert and config.tls_key:
        return config.tls_cert, config.tls_key
    return None
