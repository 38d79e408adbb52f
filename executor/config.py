"""Executor settings, read once from the environment."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field


def _default_executor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the executor connects and how it calls models and tools.

    `model_api_key` is a credential: it is excluded from `repr` so it never
    reaches a log line by accident, and nothing copies it into a step.
    """

    control_plane: str = "127.0.0.1:50051"
    executor_id: str = field(default_factory=_default_executor_id)
    capacity: int = 16
    release: str = "dev"
    model_base_url: str = "http://127.0.0.1:8010/v1"
    model_api_key: str = field(default="", repr=False)
    model_timeout_seconds: float = 60.0
    providers_url: str = "http://127.0.0.1:8020"
    provider_urls: Mapping[str, str] = field(default_factory=dict)
    tool_timeout_seconds: float = 10.0
    drain_seconds: float = 10.0

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
            model_base_url=env.get("AGENTRUN_MODEL_BASE_URL") or defaults.model_base_url,
            model_api_key=env.get("AGENTRUN_MODEL_API_KEY", ""),
            model_timeout_seconds=_positive_float(
                env, "AGENTRUN_MODEL_TIMEOUT_SECONDS", defaults.model_timeout_seconds
            ),
            providers_url=env.get("AGENTRUN_PROVIDERS_URL") or defaults.providers_url,
            provider_urls={
                name[len(prefix) :].lower(): url
                for name, url in env.items()
                if name.startswith(prefix) and url
            },
            tool_timeout_seconds=_positive_float(
                env, "AGENTRUN_TOOL_TIMEOUT_SECONDS", defaults.tool_timeout_seconds
            ),
            drain_seconds=_positive_float(env, "AGENTRUN_DRAIN_SECONDS", defaults.drain_seconds),
        )

    def provider_url(self, provider: str) -> str:
        """Base URL of one provider: its own override, else the shared providers URL."""
        return self.provider_urls.get(provider.lower(), self.providers_url).rstrip("/")


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
