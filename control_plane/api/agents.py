"""AgentService: parse, call the store, convert."""

from __future__ import annotations

import re

import grpc

from agentrun.v1 import agent_pb2, agent_pb2_grpc
from control_plane.api.admin import keyset_page, text_token
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.connections import triggering
from control_plane.ground import constraints, convert, model_parameters, validate
from control_plane.ground.errors import AlreadyExists, InvalidArgument, NotFound
from control_plane.runs import signals
from control_plane.store import agents as store
from control_plane.store.db import Pool, transaction
from control_plane.tools import guard
from control_plane.tools.guard import PublishGuard
from ground import event_match

_TOOL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as the registry names them (tool.proto)
_PROVIDER = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_TOOLS = 64
MAX_DEADLINE_SECONDS = 30 * 24 * 3600
MAX_AGE_SECONDS = 366 * 24 * 3600
MAX_CONTEXT_TOKENS = 10_000_000
MAX_CANCEL_ON = 20
# A concurrency key's path: `input.` then 1-8 names, as event_match reads `run.input...`.
_KEY_PATH = re.compile(r"^input(?:\.[A-Za-z_][A-Za-z0-9_-]{0,63}){1,8}$")
MAX_KEY_LIMIT = 10_000


def spec_limits(spec: agent_pb2.AgentSpec) -> dict[str, int]:
    """Validated limits of a spec (0 = the server default at admission)."""
    lim = spec.limits
    deadline = lim.deadline.ToTimedelta().total_seconds() if lim.HasField("deadline") else 0
    max_age = lim.max_age.ToTimedelta().total_seconds() if lim.HasField("max_age") else 0
    return {
        "max_steps": validate.in_range("spec.limits.max_steps", lim.max_steps, 0, 10_000),
        "deadline_seconds": validate.in_range(
            "spec.limits.deadline", int(deadline), 0, MAX_DEADLINE_SECONDS
        ),
        "max_tokens": validate.in_range("spec.limits.max_tokens", lim.max_tokens, 0, 10**10),
        "max_tool_calls": validate.in_range(
            "spec.limits.max_tool_calls", lim.max_tool_calls, 0, 100_000
        ),
        "model_retry_budget": validate.in_range(
            "spec.limits.model_retry_budget", lim.model_retry_budget, 0, 1000
        ),
        "max_age_seconds": validate.in_range(
            "spec.limits.max_age", int(max_age), 0, MAX_AGE_SECONDS
        ),
        "repeat_limit": validate.in_range("spec.limits.repeat_limit", lim.repeat_limit, 0, 1000),
        "context_tokens": validate.in_range(
            "spec.limits.context_tokens", lim.context_tokens, 0, MAX_CONTEXT_TOKENS
        ),
    }


def validate_spec(spec: agent_pb2.AgentSpec) -> None:
    model_parameters.validate_model(spec)
    validate.text("spec.instructions", spec.instructions, max_bytes=64 * 1024)
    validate.in_range("spec.max_concurrency", spec.max_concurrency, 0, 100_000)
    if len(spec.tools) > MAX_TOOLS:
        raise InvalidArgument(
            "spec.tools", f"has {len(spec.tools)} tools; the limit is {MAX_TOOLS}"
        )
    for i, name in enumerate(spec.tools):
        if not _TOOL.match(name):
            raise InvalidArgument(f"spec.tools[{i}]", f"is not a tool name: {name[:64]!r}")
    if len(set(spec.tools)) != len(spec.tools):
        raise InvalidArgument("spec.tools", "names a tool twice")
    validate_approval_policy(spec)
    validate_unknown_policy(spec)
    constraints.validate_constraints(spec)
    validate_connections(spec)
    validate_cancel_on(spec)
    validate_concurrency_key(spec)


def validate_concurrency_key(spec: agent_pb2.AgentSpec) -> None:
    """A key path over the input, a limit, and an optional rate (issue 45, item 3)."""
    if spec.HasField("concurrency_key"):
        validate_key_rule("spec.concurrency_key", spec.concurrency_key)


def validate_key_rule(name: str, ck: agent_pb2.ConcurrencyKey) -> None:
    """A concurrency_key rule, an agent version's or a trigger's, its errors naming `name`'s
    fields."""
    if not ck.key:
        raise InvalidArgument(f"{name}.key", "is required (e.g. input.customer_id)")
    if not _KEY_PATH.match(ck.key):
        raise InvalidArgument(
            f"{name}.key",
            f"is not `input.` then 1-8 names (e.g. input.customer_id): {ck.key[:80]!r}",
        )
    if ck.limit == 0:
        raise InvalidArgument(f"{name}.limit", "is required (1 or more)")
    validate.in_range(f"{name}.limit", ck.limit, 1, MAX_KEY_LIMIT)
    if ck.HasField("rate"):
        validate.in_range(f"{name}.rate.per_seconds", ck.rate.per_seconds, 1, 86_400)
        validate.in_range(f"{name}.rate.runs", ck.rate.runs, 1, MAX_KEY_LIMIT)


def validate_cancel_on(spec: agent_pb2.AgentSpec) -> None:
    """Each cancel_on names an event and a match expression that parses (issue 45)."""
    if len(spec.cancel_on) > MAX_CANCEL_ON:
        raise InvalidArgument("spec.cancel_on", f"has more than {MAX_CANCEL_ON} events")
    for i, entry in enumerate(spec.cancel_on):
        signals.check_name(f"spec.cancel_on[{i}].event", entry.event)
        try:
            event_match.parse(entry.match)
        except event_match.ExpressionError as exc:
            raise InvalidArgument(f"spec.cancel_on[{i}].match", str(exc)) from None


def validate_connections(spec: agent_pb2.AgentSpec) -> None:
    """provider -> connection id (or `trigger`: the run's triggering account); whether the
    connection exists is checked at call time."""
    if len(spec.connections) > MAX_TOOLS:
        raise InvalidArgument("spec.connections", f"names more than {MAX_TOOLS} providers")
    for provider, connection_id in spec.connections.items():
        if not _PROVIDER.match(provider):
            raise InvalidArgument("spec.connections", f"is not a provider name: {provider[:64]!r}")
        triggering.check_mapping(f"spec.connections[{provider}]", connection_id)


def validate_approval_policy(spec: agent_pb2.AgentSpec) -> None:
    pol = spec.approval
    for field in ("tools", "high_risk_tools"):
        for i, name in enumerate(getattr(pol, field)):
            if name not in spec.tools:
                raise InvalidArgument(
                    f"spec.approval.{field}[{i}]", f"names {name[:64]!r}, not one of spec.tools"
                )
    for field in ("approvers", "slack_approvers", "escalate_to"):
        for i, who in enumerate(getattr(pol, field)):
            validate.text(f"spec.approval.{field}[{i}]", who, max_bytes=200, required=True)
    validate.in_range("spec.approval.expiry_seconds", pol.expiry_seconds, 0, 30 * 24 * 3600)
    validate.in_range("spec.approval.max_reminders", pol.max_reminders, 0, 20)
    if pol.on_expiry == 2 and not pol.escalate_to:
        raise InvalidArgument("spec.approval.escalate_to", "is required when on_expiry is ESCALATE")


def validate_unknown_policy(spec: agent_pb2.AgentSpec) -> None:
    """Who an unknown outcome asks and how often (issue 43)."""
    pol = spec.unknown_outcome
    for field in ("ask", "slack", "escalate_to"):
        for i, who in enumerate(getattr(pol, field)):
            validate.text(f"spec.unknown_outcome.{field}[{i}]", who, max_bytes=200, required=True)
    validate.text("spec.unknown_outcome.slack_channel", pol.slack_channel, max_bytes=200)
    validate.in_range("spec.unknown_outcome.every_seconds", pol.every_seconds, 0, 30 * 24 * 3600)
    validate.in_range("spec.unknown_outcome.max_reminders", pol.max_reminders, 0, 20)
    if pol.on_timeout == agent_pb2.UNKNOWN_OUTCOME_TIMEOUT_ESCALATE and not pol.escalate_to:
        raise InvalidArgument(
            "spec.unknown_outcome.escalate_to", "is required when on_timeout is ESCALATE"
        )


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, pool: Pool, guard: PublishGuard) -> None:
        self._pool = pool
        self._guard = guard

    async def CreateAgent(
        self, request: agent_pb2.CreateAgentRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.CreateAgentResponse:
        ws = auth_context.workspace(request.workspace_id)
        agent_id = validate.slug("agent_id", request.agent_id)
        name = validate.text("display_name", request.display_name, max_bytes=200)
        async with transaction(self._pool) as conn:
            row = await store.create_agent(conn, ws, agent_id, name)
            if row is not None:
                await audit.record(conn, "agent.created", "agent", agent_id)
        if row is None:
            raise AlreadyExists(f"agent {agent_id!r} already exists in workspace {ws!r}")
        return agent_pb2.CreateAgentResponse(agent=convert.agent(row))

    async def GetAgent(
        self, request: agent_pb2.GetAgentRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetAgentResponse:
        ws = auth_context.workspace(request.workspace_id)
        agent_id = validate.slug("agent_id", request.agent_id)
        row = await store.get_agent(self._pool, ws, agent_id)
        if row is None:
            raise NotFound(f"agent {agent_id!r} not found")
        return agent_pb2.GetAgentResponse(agent=convert.agent(row))

    async def PublishAgentVersion(
        self, request: agent_pb2.PublishAgentVersionRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.PublishAgentVersionResponse:
        ws = auth_context.workspace(request.workspace_id)
        agent_id = validate.slug("agent_id", request.agent_id)
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        validate_spec(request.spec)
        stored = convert.spec_to_json(request.spec, spec_limits(request.spec))
        checked = await self._guard.check(self._pool, ws, request)
        warnings = checked.warnings
        details: dict[str, object] = {"warnings": [w.code for w in warnings]} if warnings else {}
        if request.acknowledge_trifecta:
            details["acknowledged_trifecta"] = True
        async with transaction(self._pool) as conn:
            row = await store.publish_version(
                conn, ws, agent_id, stored, checked.pins, checked.code_tools
            )
            if row is not None:
                await audit.record(
                    conn,
                    "agent.published",
                    "agent",
                    agent_id,
                    {"version": row["version"], **details},
                )
        if row is None:
            raise NotFound(f"agent {agent_id!r} not found")
        return agent_pb2.PublishAgentVersionResponse(
            version=convert.agent_version(row), warnings=guard.to_proto(warnings)
        )

    async def GetAgentVersion(
        self, request: agent_pb2.GetAgentVersionRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetAgentVersionResponse:
        ws = auth_context.workspace(request.workspace_id)
        agent_id = validate.slug("agent_id", request.agent_id)
        version = validate.non_negative("version", request.version)
        row = await store.get_version(self._pool, ws, agent_id, version)
        if row is None:
            raise NotFound(f"agent {agent_id!r} has no version {version or 'published'}")
        return agent_pb2.GetAgentVersionResponse(version=convert.agent_version(row))

    async def ListAgents(
        self, request: agent_pb2.ListAgentsRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.ListAgentsResponse:
        ws = auth_context.workspace(request.workspace_id)

        async def fetch(after: str | None, limit: int) -> list:
            return await store.list_agents(self._pool, ws, after, limit)

        rows, token = await keyset_page(request, text_token(64), fetch, lambda r: r["agent_id"])
        return agent_pb2.ListAgentsResponse(
            agents=[convert.agent(r) for r in rows], next_page_token=token
        )
