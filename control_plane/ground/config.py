"""Control-plane settings, read once from the environment."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number") from None


def _choice(name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first when unset)."""
    raw = os.environ.get(name) or choices[0]
    if raw not in choices:
        raise SystemExit(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return raw


_ORIGIN = re.compile(r"^(\*|https?://[^/\s]+)\Z")


def _origins(name: str) -> tuple[str, ...]:
    """Comma-separated web origins (`https://app.example.com`), or `*` for any."""
    found = tuple(o.strip().rstrip("/") for o in os.environ.get(name, "").split(",") if o.strip())
    for origin in found:
        if not _ORIGIN.match(origin):
            raise SystemExit(f"{name}: {origin!r} is not an origin (scheme://host[:port]) or *")
    return found


def _secret(name: str) -> bytes | None:
    raw = os.environ.get(name)
    return raw.encode() if raw else None


@dataclass(frozen=True)
class RunDefaults:
    """Limits given to runs whose agent version leaves them unset."""

    max_steps: int = 50
    deadline_seconds: int = 1800
    max_tokens: int = 1_000_000
    max_tool_calls: int = 300
    model_retry_budget: int = 30
    # The same tool with the same arguments this many times parks the run for a person.
    repeat_limit: int = 3


@dataclass(frozen=True)
class ServerConfig:
    database_url: str
    listen: str = "127.0.0.1:50051"
    port_file: str | None = None
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    # Runs of fast-path versions are heartbeated this often (control_plane/dispatch/fast_path.py).
    fast_path_heartbeat_seconds: float = 2.0
    claim_poll_seconds: float = 0.5
    # Fast takeover (control_plane/dispatch/liveness.py, safety argument in
    # store/sql/lease.sql): the send horizon H announced in the Welcome (0: off, runs of
    # a broken stream wait out their lease), the margin added to it before a broken
    # stream's runs may be taken over, and how long a pinging stream may stay silent.
    send_horizon_seconds: float = 1.5
    release_margin_seconds: float = 0.5
    stream_dead_seconds: float = 3.0
    claim_batch: int = 64
    release: str = "dev"
    # AGENTRUN_RELEASE_GATE=canary (the default): a release takes new runs only once a
    # canary on it passed (each executor's connect runs one while it has not:
    # deploys/self_check.py), and none while its last canary failed; =off (explicit, and
    # said in the log at start): as soon as its executors connect.
    release_gate: bool = True
    max_message_bytes: int = 4 * 1024 * 1024
    # The executor service's own listener (AGENTRUN_EXECUTOR_LISTEN) receives messages up to
    # this size, so a Commit over `max_message_bytes` reaches the commit handler and is refused
    # for its run alone (COMMIT_OUTCOME_INVALID) instead of grpc ending the whole stream.
    executor_max_message_bytes: int = 64 * 1024 * 1024
    # The largest payload (a large tool result, uploaded in chunks) an executor may store.
    max_payload_bytes: int = 64 * 1024 * 1024
    defaults: RunDefaults = RunDefaults()
    # Approvals: where links point, where notifications go.
    public_url: str = "http://127.0.0.1:8080"
    notify_url: str = "http://127.0.0.1:8020"
    # Sign-in (OpenID Connect): the issuer whose ID tokens identify people, and the
    # audience (client id) they must be issued for. No issuer: nobody can sign in. The
    # issuer is compared with the tokens' `iss` exactly (a trailing slash included).
    oidc_issuer: str | None = None
    oidc_audience: str = "agentrun"
    slack_signing_secret: bytes | None = field(default=None, repr=False)
    approval_poll_seconds: float = 0.5
    # How often alert rules are evaluated (control_plane/channels/alerts.py).
    alert_poll_seconds: float = 15.0
    # HTTP ingress (webhooks, sessions). In-process servers take a free port by
    # default; the environment's default is 127.0.0.1:8080.
    http_listen: str = "127.0.0.1:0"
    http_port_file: str | None = None
    webhook_max_body_bytes: int = 256 * 1024
    # Web origins whose pages may call the HTTP/JSON API (/v1/) from a browser (CORS);
    # empty: none but the ingress's own.
    http_cors_origins: tuple[str, ...] = ()
    # Triggers: how often the scheduler and the push fetcher look for due work,
    # and how far back a schedule catches up on slots missed while no replica ran.
    scheduler_poll_seconds: float = 1.0
    schedule_catchup_seconds: float = 600.0
    push_poll_seconds: float = 1.0
    # Transport security (control_plane/ops/tls.py): PEM files. With a certificate and key,
    # gRPC and HTTP serve TLS only; with a client CA, the executor listener requires
    # client certificates it signed. An executor listener serves ExecutorService apart
    # from the public API (which then refuses it).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    executor_listen: str | None = None
    executor_port_file: str | None = None
    # Envelope encryption (control_plane/crypto): which KMS wraps the workspaces' data keys
    # and, for the local one, its key file (None: the dev default, made on first use).
    kms: str = "local"
    kms_key_file: str | None = None
    # Identity: how long a replica trusts a verified key before asking the
    # database again (a revocation reaches every replica within this + one
    # lookup). (Who signs in: oidc_issuer and oidc_audience above.)
    key_cache_seconds: float = 2.0
    # Publishing a tool set with the lethal trifecta: "warn" (published, with a
    # warning) or "acknowledge" (refused unless the request acknowledges it).
    trifecta_policy: str = "warn"
    # Connected accounts: where the providers' OAuth endpoints are (`{url}/oauth/{provider}/
    # authorize|token`; None: the notify URL, where the sandbox providers serve them), and
    # the client credentials (the default is the sandbox's well-known dev secret).
    oauth_url: str | None = None
    oauth_client_id: str = "agentrun"
    oauth_client_secret: str = field(default="sandbox-client-secret", repr=False)  # noqa: S105
    # The bearer token a Prometheus scraper sends for /metrics (besides a platform key).
    metrics_token: str | None = field(default=None, repr=False)

    @property
    def executor_receive_bytes(self) -> int:
        """The largest message the executor service receives: its own listener's bound
        (above the commit limit, which the commit handler enforces per run), else the
        public server's."""
        if self.executor_listen:
            return max(self.executor_max_message_bytes, self.max_message_bytes)
        return self.max_message_bytes

    @classmethod
    def from_env(cls) -> ServerConfig:
        url = os.environ.get("DATABASE_URL")
        if not url:
            raise SystemExit("DATABASE_URL is not set (agentrun dev starts an embedded one)")
        return cls(
            database_url=url,
            listen=os.environ.get("AGENTRUN_LISTEN", cls.listen),
            port_file=os.environ.get("AGENTRUN_PORT_FILE") or None,
            lease_seconds=_float("AGENTRUN_LEASE_SECONDS", cls.lease_seconds),
            heartbeat_seconds=_float("AGENTRUN_HEARTBEAT_SECONDS", cls.heartbeat_seconds),
            fast_path_heartbeat_seconds=_float(
                "AGENTRUN_FAST_PATH_HEARTBEAT_SECONDS", cls.fast_path_heartbeat_seconds
            ),
            claim_poll_seconds=_float("AGENTRUN_CLAIM_POLL_SECONDS", cls.claim_poll_seconds),
            **cls._liveness_from_env(),
            release=os.environ.get("AGENTRUN_RELEASE", cls.release),
            release_gate=_choice("AGENTRUN_RELEASE_GATE", ("canary", "off")) == "canary",
            public_url=os.environ.get("AGENTRUN_PUBLIC_URL", cls.public_url).rstrip("/"),
            notify_url=os.environ.get("AGENTRUN_NOTIFY_URL", cls.notify_url).rstrip("/"),
            **cls._secrets_from_env(),
            approval_poll_seconds=_float("AGENTRUN_APPROVAL_POLL_SECONDS", 0.5),
            alert_poll_seconds=_float("AGENTRUN_ALERT_POLL_SECONDS", cls.alert_poll_seconds),
            http_listen=os.environ.get("AGENTRUN_HTTP_LISTEN", "127.0.0.1:8080"),
            http_port_file=os.environ.get("AGENTRUN_HTTP_PORT_FILE") or None,
            webhook_max_body_bytes=int(
                _float("AGENTRUN_WEBHOOK_MAX_BYTES", cls.webhook_max_body_bytes)
            ),
            http_cors_origins=_origins("AGENTRUN_HTTP_CORS_ORIGINS"),
            scheduler_poll_seconds=_float(
                "AGENTRUN_SCHEDULER_POLL_SECONDS", cls.scheduler_poll_seconds
            ),
            schedule_catchup_seconds=_float(
                "AGENTRUN_SCHEDULE_CATCHUP_SECONDS", cls.schedule_catchup_seconds
            ),
            push_poll_seconds=_float("AGENTRUN_PUSH_POLL_SECONDS", cls.push_poll_seconds),
            **cls._transport_from_env(),
        )

    @classmethod
    def _liveness_from_env(cls) -> dict[str, Any]:
        """The send horizon, its release margin and the silent-stream timeout."""
        horizon = _float("AGENTRUN_SEND_HORIZON_SECONDS", cls.send_horizon_seconds)
        margin = _float("AGENTRUN_RELEASE_MARGIN_SECONDS", cls.release_margin_seconds)
        dead = _float("AGENTRUN_STREAM_DEAD_SECONDS", cls.stream_dead_seconds)
        if horizon < 0 or margin < 0.1 or dead <= 0:
            raise SystemExit(
                "AGENTRUN_SEND_HORIZON_SECONDS must be >= 0, "
                "AGENTRUN_RELEASE_MARGIN_SECONDS >= 0.1, "
                "AGENTRUN_STREAM_DEAD_SECONDS > 0"
            )
        return dict(
            send_horizon_seconds=horizon, release_margin_seconds=margin, stream_dead_seconds=dead
        )

    @classmethod
    def _transport_from_env(cls) -> dict[str, Any]:
        """TLS, the executor listener and message limits."""
        return dict(
            tls_cert=os.environ.get("AGENTRUN_TLS_CERT") or None,
            tls_key=os.environ.get("AGENTRUN_TLS_KEY") or None,
            tls_client_ca=os.environ.get("AGENTRUN_TLS_CLIENT_CA") or None,
            executor_listen=os.environ.get("AGENTRUN_EXECUTOR_LISTEN") or None,
            executor_port_file=os.environ.get("AGENTRUN_EXECUTOR_PORT_FILE") or None,
            executor_max_message_bytes=int(
                _float("AGENTRUN_EXECUTOR_MAX_MESSAGE_BYTES", cls.executor_max_message_bytes)
            ),
            max_payload_bytes=int(_float("AGENTRUN_MAX_PAYLOAD_BYTES", cls.max_payload_bytes)),
        )

    @classmethod
    def _secrets_from_env(cls) -> dict[str, Any]:
        """Identity, sign-in, the KMS and connected accounts' OAuth client."""
        return dict(
            oidc_issuer=os.environ.get("AGENTRUN_OIDC_ISSUER") or None,
            oidc_audience=os.environ.get("AGENTRUN_OIDC_AUDIENCE") or cls.oidc_audience,
            slack_signing_secret=_secret("AGENTRUN_SLACK_SIGNING_SECRET"),
            kms=os.environ.get("AGENTRUN_KMS", cls.kms),
            kms_key_file=os.environ.get("AGENTRUN_KMS_KEY_FILE") or None,
            key_cache_seconds=_float("AGENTRUN_KEY_CACHE_SECONDS", cls.key_cache_seconds),
            trifecta_policy=_choice("AGENTRUN_TRIFECTA_POLICY", ("warn", "acknowledge")),
            oauth_url=(os.environ.get("AGENTRUN_OAUTH_URL") or "").rstrip("/") or None,
            oauth_client_id=os.environ.get("AGENTRUN_OAUTH_CLIENT_ID", cls.oauth_client_id),
            oauth_client_secret=os.environ.get(
                "AGENTRUN_OAUTH_CLIENT_SECRET", cls.oauth_client_secret
            ),
            metrics_token=os.environ.get("AGENTRUN_METRICS_TOKEN") or None,
        )
