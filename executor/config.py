"""Executor settings, read once from the environment."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from executor.models.profiles import ModelProfile, parse_profiles
from executor.ratelimit.rates import RateTable
from executor.transport import ChannelSecurity


def _default_executor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the executor connects and how it calls models and tools.

    `model_api_key` is a credential: it is excluded from `repr` so it never
    reaches a log line by accident, and nothing copies it into a step (nor is
    `redis_url`, which may carry a password). Without `redis_url` tool calls
    are not rate limited (a provider's 429 still parks the run).
    """

    control_plane: str = "127.0.0.1:50051"
    executor_id: str = field(default_factory=_default_executor_id)
    capacity: int = 16
    release: str = "dev"
    # Earlier releases whose runs this one may continue (AGENTRUN_CONTINUES, comma-separated).
    continues: tuple[str, ...] = ()
    model_base_url: str = "http://127.0.0.1:8010/v1"
    model_api_key: str = field(default="", repr=False)
    model_timeout_seconds: float = 60.0
    # Named model profiles (executor/models/profiles.py, AGENTRUN_MODEL_PROFILES); their
    # keys come from the environment and are excluded from repr like model_api_key.
    model_profiles: Mapping[str, ModelProfile] = field(default_factory=dict)
    # The profile that serves versions naming none (AGENTRUN_MODEL_DEFAULT_PROFILE); empty:
    # the default endpoint above. `agentrun dev` sets it when a provider key is in its
    # environment, so the user's agents call the real model.
    model_default_profile: str = ""
    # Every model call streamed (AGENTRUN_MODEL_STREAM, default on): its text goes to the
    # run's Durable Stream as it is generated (docs/streams.md). Off: only fast-path runs
    # stream, as their watchers wait for the text.
    model_stream: bool = True
    providers_url: str = "http://127.0.0.1:8020"
    provider_urls: Mapping[str, str] = field(default_factory=dict)
    tool_timeout_seconds: float = 10.0
    # How long a drain gives held runs to reach a turn boundary (AGENTRUN_DRAIN_SECONDS);
    # None: the longest turn of the runs held (model call timeout plus slowest tool's).
    drain_seconds: float | None = None
    # Stream liveness (executor/stream.py): a Ping this often once the control plane
    # announced a send horizon; no Pong for stream_dead_seconds declares the stream dead.
    ping_seconds: float = 0.5
    stream_dead_seconds: float = 3.0
    redis_url: str | None = field(default=None, repr=False)
    rate_limits: RateTable = field(default_factory=RateTable)
    rate_cooldown_seconds: float = 60.0
    rate_penalty_factor: float = 0.5
    redis_backoff_cap_seconds: float = 30.0
    model_backoff_cap_seconds: float = 60.0
    # A run whose task failed unexpectedly waits this long, doubled each time after, and
    # fails the fifth time (executor/run_loop.py RunLoop._crashed).
    crash_backoff_seconds: float = 5.0
    # TLS to the control plane (executor/transport.py); plaintext by default.
    tls: ChannelSecurity = field(default_factory=ChannelSecurity)
    # The executor credential the control plane knows this pool by (AGENTRUN_EXECUTOR_KEY).
    executor_key: str = field(default="", repr=False)
    # This installation's name in the chain marker of mail runs send (AGENTRUN_INSTALLATION_ID).
    installation: str = ""
    # Large results (executor/payloads.py): outputs over the threshold are stored as payloads
    # and the prompt shows the first view bytes; read_result returns at most read max bytes.
    payload_threshold_bytes: int = 64 * 1024
    payload_view_bytes: int = 8 * 1024
    read_result_max_bytes: int = 64 * 1024

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutorConfig:
        """Build the config from `AGENTRUN_*` variables; unset ones keep their defaults."""
        env = os.environ if environ is None else environ
        defaults = cls()
        prefix = "AGENTRUN_PROVIDER_URL_"
        return cls(
            control_plane=env.get("AGENTRUN_CONTROL_PLANE") or defaults.control_plane,
            executor_id=env.get("AGENTRUN_EXECUTOR_ID") or defaults.executor_id,
            capacity=_positive_int(env, "AGENTRUN_CAPACITY", defaults.capacity),
            release=env.get("AGENTRUN_RELEASE") or defaults.release,
            continues=tuple(
                r.strip() for r in env.get("AGENTRUN_CONTINUES", "").split(",") if r.strip()
            ),
            model_base_url=env.get("AGENTRUN_MODEL_BASE_URL") or defaults.model_base_url,
            model_api_key=env.get("AGENTRUN_MODEL_API_KEY", ""),
            model_timeout_seconds=_positive_float(
                env, "AGENTRUN_MODEL_TIMEOUT_SECONDS", defaults.model_timeout_seconds
            ),
            **_models_from_env(env),
            model_stream=_switch(env, "AGENTRUN_MODEL_STREAM", defaults.model_stream),
            providers_url=env.get("AGENTRUN_PROVIDERS_URL") or defaults.providers_url,
            provider_urls={
                name[len(prefix) :].lower(): url
                for name, url in env.items()
                if name.startswith(prefix) and url
            },
            tool_timeout_seconds=_positive_float(
                env, "AGENTRUN_TOOL_TIMEOUT_SECONDS", defaults.tool_timeout_seconds
            ),
            drain_seconds=_positive_float(env, "AGENTRUN_DRAIN_SECONDS", 0.0) or None,
            ping_seconds=_positive_float(env, "AGENTRUN_PING_SECONDS", defaults.ping_seconds),
            stream_dead_seconds=_positive_float(
                env, "AGENTRUN_STREAM_DEAD_SECONDS", defaults.stream_dead_seconds
            ),
            crash_backoff_seconds=_positive_float(
                env, "AGENTRUN_CRASH_BACKOFF_SECONDS", defaults.crash_backoff_seconds
            ),
            executor_key=env.get("AGENTRUN_EXECUTOR_KEY", ""),
            installation=env.get("AGENTRUN_INSTALLATION_ID", ""),
            payload_threshold_bytes=_positive_int(
                env, "AGENTRUN_PAYLOAD_THRESHOLD_BYTES", defaults.payload_threshold_bytes
            ),
            payload_view_bytes=_positive_int(
                env, "AGENTRUN_PAYLOAD_VIEW_BYTES", defaults.payload_view_bytes
            ),
            read_result_max_bytes=_positive_int(
                env, "AGENTRUN_READ_RESULT_MAX_BYTES", defaults.read_result_max_bytes
            ),
            **_limits_from_env(env, defaults),
            tls=ChannelSecurity.from_env(env),
        )

    def provider_url(self, provider: str) -> str:
        """Base URL of one provider: its own override, else the shared providers URL."""
        return self.provider_urls.get(provider.lower(), self.providers_url).rstrip("/")


def _models_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The model profiles and the one (if any) that serves versions naming none."""
    profiles = parse_profiles(env.get("AGENTRUN_MODEL_PROFILES", ""), env)
    default = env.get("AGENTRUN_MODEL_DEFAULT_PROFILE", "").strip()
    if default and default not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise ValueError(
            f"AGENTRUN_MODEL_DEFAULT_PROFILE names {default!r}, which AGENTRUN_MODEL_PROFILES "
            f"does not define (it defines: {known})"
        )
    return {"model_profiles": profiles, "model_default_profile": default}


def _limits_from_env(env: Mapping[str, str], defaults: ExecutorConfig) -> dict[str, Any]:
    """Rate limits (`AGENTRUN_RATE_LIMITS`, see executor/ratelimit/rates.py) and backoffs."""
    try:
        rates = RateTable.parse(env.get("AGENTRUN_RATE_LIMITS", ""))
    except ValueError as exc:
        raise ValueError(f"AGENTRUN_RATE_LIMITS: {exc}") from None
    factor = _positive_float(env, "AGENTRUN_RATE_PENALTY_FACTOR", defaults.rate_penalty_factor)
    if factor > 1:
        raise ValueError(f"AGENTRUN_RATE_PENALTY_FACTOR must be at most 1, got {factor}")
    return {
        "redis_url": env.get("REDIS_URL") or None,
        "rate_limits": rates,
        "rate_cooldown_seconds": _positive_float(
            env, "AGENTRUN_RATE_COOLDOWN_SECONDS", defaults.rate_cooldown_seconds
        ),
        "rate_penalty_factor": factor,
        "redis_backoff_cap_seconds": _positive_float(
            env, "AGENTRUN_REDIS_BACKOFF_CAP_SECONDS", defaults.redis_backoff_cap_seconds
        ),
        "model_backoff_cap_seconds": _positive_float(
            env, "AGENTRUN_MODEL_BACKOFF_CAP_SECONDS", defaults.model_backoff_cap_seconds
        ),
    }


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("on", "true", "1", "yes"):
        return True
    if raw in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{name} must be on or off, got {raw!r}")


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    value = int(raw)
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return value


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    value = float(raw)
    if value <= 0:
        raise ValueError(f"{name} must be a positive number, got {raw!r}")
    return value
