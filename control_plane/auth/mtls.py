"""Executor identity from a verified client certificate (mutual TLS), instead of a key.

The executor listener requires client certificates signed by `AGENTRUN_TLS_CLIENT_CA`
(control_plane/ops/tls.py); grpc verifies the chain in the handshake and hands the peer's
identity to the call as `context.auth_context()`. A certificate names an executor by
URI subject alternative names:

* `agentrun://executor/<pool>` marks it as an executor certificate at all. Without it the
  certificate is not an executor's (an ordinary client certificate signed by the same CA
  gets no executor rights).
* `agentrun://workspace/<id>`, any number: the workspaces the pool may serve. None means
  all workspaces. A malformed workspace URI refuses the certificate rather than widen its
  scope to everything.

The principal's name is the certificate's common name (else the pool); its credential id
is `cert:` and the first 16 hex digits of the certificate's SHA-256 fingerprint.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from collections.abc import Mapping, Sequence

from control_plane.auth.principal import Kind, Principal

log = logging.getLogger(__name__)

EXECUTOR_URI = "agentrun://executor/"
WORKSPACE_URI = "agentrun://workspace/"


def _text(values: Sequence[bytes] | None) -> list[str]:
    return [v.decode("utf-8", "replace") for v in values or ()]


def _segment(uri: str, prefix: str) -> str | None:
    """The one path segment after `prefix`, or None when the URI is not exactly that."""
    rest = uri[len(prefix) :]
    if not rest or "/" in rest or "?" in rest or "#" in rest or len(rest.encode()) > 63:
        return None
    return rest


def _scope(uris: list[str]) -> frozenset[str] | None:
    """The workspaces named by the URIs, None for all; ValueError when one is malformed."""
    workspaces = set()
    for uri in uris:
        if uri.startswith(WORKSPACE_URI):
            workspace = _segment(uri, WORKSPACE_URI)
            if workspace is None:
                raise ValueError(uri)
            workspaces.add(workspace)
    return frozenset(workspaces) if workspaces else None


def _fingerprint(pem: bytes) -> str:
    der = ssl.PEM_cert_to_DER_cert(pem.decode("ascii"))
    return hashlib.sha256(der).hexdigest()[:16]


def executor_from_peer(auth_context: Mapping[str, Sequence[bytes]]) -> Principal | None:
    """The executor principal of a verified client certificate, or None (no certificate,
    not an executor certificate, or a malformed one).

    `auth_context` is what `context.auth_context()` returns on the executor listener.
    """
    if list(auth_context.get("transport_security_type", ())) != [b"ssl"]:
        return None
    pem = auth_context.get("x509_pem_cert")
    if not pem:
        return None  # the port did not ask for a certificate: nothing was verified
    uris = _text(auth_context.get("peer_uri"))
    pools = {_segment(uri, EXECUTOR_URI) for uri in uris if uri.startswith(EXECUTOR_URI)}
    pool = pools.pop() if len(pools) == 1 else None
    if pool is None:
        return None  # no marker, a malformed one, or two pools
    try:
        scope = _scope(uris)
    except ValueError:
        log.warning("client certificate refused: a malformed %s URI", WORKSPACE_URI)
        return None
    common_names = _text(auth_context.get("x509_common_name"))
    return Principal(
        kind=Kind.EXECUTOR,
        name=common_names[0] if common_names else pool,
        scope=scope,
        credential_id=f"cert:{_fingerprint(pem[0])}",
    )
