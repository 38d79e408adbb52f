"""An agent version's model profile and parameters: validation and the stored form.

The profile is a name only: what it stands for (provider, endpoint, model,
credential) is executor configuration (executor/models/profiles.py), so the
control plane checks its shape, not its existence.
"""

from __future__ import annotations

import math
from typing import Any

from agentrun.v1 import agent_pb2
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument

TOOL_CHOICES = ("auto", "none", "required")
MAX_TIMEOUT_SECONDS = 3600
MAX_OUTPUT_TOKENS = 1_000_000


def validate_model(spec: agent_pb2.AgentSpec) -> None:
    """spec.model (required unless a profile names the model), the profile and parameters."""
    validate.text("spec.model", spec.model, max_bytes=200, required=not spec.model_profile)
    if spec.model_profile:
        validate.slug("spec.model_profile", spec.model_profile)
    params = spec.model_parameters
    validate.in_range("spec.model_parameters.max_tokens", params.max_tokens, 0, MAX_OUTPUT_TOKENS)
    if params.HasField("temperature"):
        t = params.temperature
        if not (math.isfinite(t) and 0.0 <= t <= 2.0):
            raise InvalidArgument(
                "spec.model_parameters.temperature", f"must be between 0 and 2, got {t}"
            )
    choice = params.tool_choice
    if choice and choice not in TOOL_CHOICES and choice not in spec.tools:
        raise InvalidArgument(
            "spec.model_parameters.tool_choice",
            f"must be auto, none, required or one of spec.tools, got {choice[:64]!r}",
        )
    if params.HasField("timeout"):
        _timeout(params)


def _timeout(params: agent_pb2.ModelParameters) -> None:
    field = "spec.model_parameters.timeout"
    seconds, nanos = params.timeout.seconds, params.timeout.nanos
    if seconds < 0 or nanos < 0 or nanos >= 1_000_000_000:
        raise InvalidArgument(field, "must be a positive duration")
    if seconds + nanos / 1e9 > MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(field, f"must be at most {MAX_TIMEOUT_SECONDS}s")


def to_json(spec: agent_pb2.AgentSpec) -> dict[str, Any]:
    """The stored fields; nothing for a spec without profile or parameters, so older
    specs keep their stored form."""
    out: dict[str, Any] = {}
    if spec.model_profile:
        out["model_profile"] = spec.model_profile
    if not spec.HasField("model_parameters"):
        return out
    params = spec.model_parameters
    stored: dict[str, Any] = {"max_tokens": params.max_tokens, "tool_choice": params.tool_choice}
    if params.HasField("temperature"):
        stored["temperature"] = params.temperature
    if params.HasField("parallel_tool_calls"):
        stored["parallel_tool_calls"] = params.parallel_tool_calls
    if params.HasField("timeout"):
        stored["timeout_seconds"] = params.timeout.ToNanoseconds() / 1e9
    out["model_parameters"] = stored
    return out


def from_json(data: dict[str, Any]) -> dict[str, Any]:
    """AgentSpec keyword arguments for the stored fields."""
    out: dict[str, Any] = {"model_profile": data.get("model_profile", "")}
    stored = data.get("model_parameters")
    if not isinstance(stored, dict):
        return out
    params = agent_pb2.ModelParameters(
        max_tokens=stored.get("max_tokens", 0), tool_choice=stored.get("tool_choice", "")
    )
    if "temperature" in stored:
        params.temperature = stored["temperature"]
    if "parallel_tool_calls" in stored:
        params.parallel_tool_calls = stored["parallel_tool_calls"]
    if "timeout_seconds" in stored:
        params.timeout.FromNanoseconds(int(stored["timeout_seconds"] * 1e9))
    out["model_parameters"] = params
    return out
