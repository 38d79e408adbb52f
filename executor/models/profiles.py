"""Model profiles: which API, endpoint, model and credential an agent version's calls use.

An agent version names a profile (`AgentSpec.model_profile`); the executor's
configuration says what it is. `AGENTRUN_MODEL_PROFILES` holds a JSON object,
inline or as the path of a file holding it::

    {"claude": {"provider": "anthropic", "base_url": "https://api.anthropic.com",
                "model": "claude-sonnet-4-5", "api_key_env": "ANTHROPIC_API_KEY",
                "max_tokens": 4096, "timeout_seconds": 120},
     "gpt":    {"provider": "openai", "base_url": "https://api.openai.com/v1",
                "api_key_env": "OPENAI_API_KEY",
                "token_limit_field": "max_completion_tokens"}}

* `provider`: `openai` (chat completions, any compatible server) or `anthropic`
  (native Messages API; its base URL is without `/v1`, as the SDK's);
* `model`: the model name sent; absent = the version's `spec.model`;
* `api_key_env`: the environment variable that holds the key. Keys are read
  from the environment only, never from the file, and never logged;
* `max_tokens`: the output limit when the version sets none (Anthropic needs one:
  4096 by default); `timeout_seconds`: the call timeout when the version sets none;
* `token_limit_field` (openai): `max_tokens` (default) or `max_completion_tokens`;
* `api_version` (anthropic): the `anthropic-version` header, 2023-06-01 by default.

An empty profile is the executor's default endpoint (`AGENTRUN_MODEL_BASE_URL`,
OpenAI-compatible), as before profiles existed. A profile this executor does
not know parks the run as a model failure (the pool's configuration may be
fixed meanwhile); the run's model retry budget bounds that wait.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrun.v1 import agent_pb2
from executor.models.anthropic import API_VERSION, AnthropicMessagesModel
from executor.models.base import (
    DEFAULT_SETTINGS,
    ModelClient,
    ModelReply,
    ModelSettings,
    ModelUnavailable,
)
from executor.models.openai import TOKEN_LIMIT_FIELDS, OpenAIChatModel

PROVIDERS = ("openai", "anthropic")
_KEYS = {
    "provider",
    "base_url",
    "model",
    "api_key_env",
    "max_tokens",
    "timeout_seconds",
    "token_limit_field",
    "api_version",
}


@dataclass(frozen=True)
class ModelProfile:
    name: str
    provider: str
    base_url: str
    model: str = ""
    api_key: str = field(default="", repr=False)
    max_tokens: int = 0
    timeout_seconds: float | None = None
    token_limit_field: str = "max_tokens"
    api_version: str = API_VERSION

    def client(self, default_timeout: float) -> ModelClient:
        timeout = self.timeout_seconds or default_timeout
        if self.provider == "anthropic":
            return AnthropicMessagesModel(
                self.base_url,
                self.api_key,
                timeout,
                default_max_tokens=self.max_tokens,
                api_version=self.api_version,
            )
        return OpenAIChatModel(
            self.base_url,
            self.api_key,
            timeout,
            token_limit_field=self.token_limit_field,
            default_max_tokens=self.max_tokens,
        )


def parse_profiles(raw: str, env: Mapping[str, str]) -> dict[str, ModelProfile]:
    """Profiles from `AGENTRUN_MODEL_PROFILES` (JSON, or a file path); ValueError names
    the bad profile and field (never a key's value)."""
    raw = raw.strip()
    if not raw:
        return {}
    try:
        text = raw if raw.startswith("{") else Path(raw).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"AGENTRUN_MODEL_PROFILES: cannot read {raw}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"AGENTRUN_MODEL_PROFILES is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("AGENTRUN_MODEL_PROFILES must be a JSON object of profiles")
    return {str(name): _profile(str(name), spec, env) for name, spec in data.items()}


def _profile(name: str, spec: Any, env: Mapping[str, str]) -> ModelProfile:
    where = f"AGENTRUN_MODEL_PROFILES[{name!r}]"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be an object")
    if unknown := sorted(set(spec) - _KEYS):
        hint = " (keys come from the environment: api_key_env)" if "api_key" in unknown else ""
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}{hint}")
    provider, base_url = spec.get("provider"), spec.get("base_url")
    if provider not in PROVIDERS:
        raise ValueError(f"{where}.provider must be one of {', '.join(PROVIDERS)}")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"{where}.base_url must be an http(s) URL")
    if spec.get("token_limit_field", "max_tokens") not in TOKEN_LIMIT_FIELDS:
        raise ValueError(f"{where}.token_limit_field must be one of {TOKEN_LIMIT_FIELDS}")
    key_env = spec.get("api_key_env") or ""
    if key_env and key_env not in env:
        raise ValueError(f"{where}.api_key_env names {key_env}, which is not set")
    return ModelProfile(
        name=name,
        provider=provider,
        base_url=base_url,
        model=str(spec.get("model") or ""),
        api_key=env.get(key_env, "") if key_env else "",
        max_tokens=_number(spec, "max_tokens", where, int) or 0,
        timeout_seconds=_number(spec, "timeout_seconds", where, float),
        token_limit_field=spec.get("token_limit_field", "max_tokens"),
        api_version=str(spec.get("api_version") or API_VERSION),
    )


def _number(spec: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{where}.{key} must be a positive number")
    return kind(value)


def settings_of(spec: agent_pb2.AgentSpec) -> ModelSettings:
    """The version's profile and parameters as one call's settings."""
    params = spec.model_parameters
    timeout = params.timeout.ToNanoseconds() / 1e9 if params.HasField("timeout") else 0.0
    return ModelSettings(
        profile=spec.model_profile,
        max_tokens=params.max_tokens,
        temperature=params.temperature if params.HasField("temperature") else None,
        tool_choice=params.tool_choice,
        parallel_tool_calls=(
            params.parallel_tool_calls if params.HasField("parallel_tool_calls") else None
        ),
        timeout_seconds=timeout or None,
    )


async def ask(
    model: ModelClient,
    spec: agent_pb2.AgentSpec,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    run_id: str,
    seq: int,
    on_delta: Callable[[str], None] | None = None,
) -> ModelReply:
    """One call for this version; a version without profile or parameters is called
    exactly as before profiles existed (any ModelClient serves it). With `on_delta`
    (executor/deltas.py) the reply is streamed and its text told as it comes."""
    settings = settings_of(spec)
    if on_delta is not None:
        settings = dataclasses.replace(settings, on_delta=on_delta)
    if settings == DEFAULT_SETTINGS:
        return await model.complete(spec.model, messages, tools, run_id, seq)
    return await model.complete(spec.model, messages, tools, run_id, seq, settings=settings)


def requested(model: ModelClient, spec: agent_pb2.AgentSpec) -> tuple[str, str]:
    """The provider (its API: `openai` or `anthropic`) and the model name a call of this
    version is sent with, for its span (telemetry/genai.py)."""
    if isinstance(model, ModelRouter):
        return model.requested(spec.model_profile, spec.model)
    if isinstance(model, AnthropicMessagesModel):
        return "anthropic", spec.model
    return "openai", spec.model  # the default endpoint is OpenAI-compatible


class ModelRouter:
    """The executor's ModelClient: the default endpoint, or the version's profile."""

    def __init__(
        self,
        default: ModelClient,
        profiles: Mapping[str, ModelProfile],
        default_timeout: float = 60.0,
        default_profile: str = "",
    ) -> None:
        self._default = default
        self._profiles = dict(profiles)
        # Serves versions that name no profile, in place of `default` (when set).
        self._default_profile = default_profile
        self._timeout = default_timeout
        self._clients: dict[str, ModelClient] = {}

    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        run_id: str,
        seq: int,
        *,
        settings: ModelSettings = DEFAULT_SETTINGS,
    ) -> ModelReply:
        name = settings.profile or self._default_profile
        if not name:
            return await self._default.complete(
                model, messages, tools, run_id, seq, settings=settings
            )
        profile = self._profiles.get(name)
        if profile is None:
            raise ModelUnavailable(f"model profile {name!r} is not configured on this executor")
        client = self._clients.get(profile.name)
        if client is None:
            client = self._clients[profile.name] = profile.client(self._timeout)
        settings = dataclasses.replace(
            settings, timeout_seconds=settings.timeout_seconds or profile.timeout_seconds
        )
        return await client.complete(
            profile.model or model, messages, tools, run_id, seq, settings=settings
        )

    def requested(self, profile: str, model: str) -> tuple[str, str]:
        """The provider and model name a call with `profile` is sent with."""
        found = self._profiles.get(profile or self._default_profile)
        if found is None:
            return requested(self._default, agent_pb2.AgentSpec(model=model))
        return found.provider, found.model or model

    async def aclose(self) -> None:
        for client in [self._default, *self._clients.values()]:
            close = getattr(client, "aclose", None)
            if close is not None:
                await close()
