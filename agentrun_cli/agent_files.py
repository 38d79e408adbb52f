"""Agents as files: a YAML document that says everything an AgentSpec holds.

    agent: triage                 # the agent id (created if missing)
    name: Triage desk             # display name, used when the agent is created
    model: demo
    instructions: |
      Answer the customer; look them up first.
    tools: [crm_lookup, send_email]
    limits: {max_steps: 20, deadline: 10m, max_tokens: 200000, max_age: 7d}
    approval: {tools: [send_email], approvers: [manager@example.com], expiry: 24h,
               on_expiry: reject}
    unknown_outcome: {ask: [approvers, starter], every: 4h, on_timeout: escalate,
                      escalate_to: [oncall@example.com]}   # who an unknown outcome asks
    max_concurrency: 5
    constraints:
      - {tool: send_email, rule: recipient_known_or_approval, known_recipients: ["@example.com"]}
      - {tool: send_email, rule: untrusted_value, action: hold}   # docs/tools.md
    on_refusal: fail              # retry (default), fail or ask
    connections: {mail: 8f7c…}    # provider -> connection id
    acknowledge_trifecta: false

An entry of `tools` may also be a whole tool definition (agentrun_cli/tool_files.py, with its
`name`): `apply` saves it to the workspace's registry first (a new version only if it
changed), then publishes with its name.

Field names are the proto's (agent.proto); durations take what the CLI's flags take
(agentrun_cli/durations.py: `90s`, `10m`, `1.5h`, `1d2h`, `PT1H` or a number of seconds;
`approval.expiry` is whole seconds, rounded up); enums take their short lower-case names
(`reply_to_trigger_thread`, `escalate`). A key the spec does not have is an
error naming it (and the nearest known key), so a typo never publishes a
spec that silently lacks a limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from agentrun.v1 import agent_pb2, approval_pb2, tool_pb2
from agentrun_cli import durations, tool_files
from agentrun_cli.spec_files import Aliases, SpecFileError, read_text, unknown_keys

# Keys of the file that are not in AgentSpec.
FILE_KEYS = {"agent", "name", "acknowledge_trifecta"}
_DURATIONS = {"deadline", "max_age"}
_ENUM_PREFIX = {
    "rule": "CONSTRAINT_RULE_",
    "on_expiry": "EXPIRY_ACTION_",
    "value_kind": "VALUE_KIND_",
    "action": "CONSTRAINT_ACTION_",
    "on_refusal": "ON_REFUSAL_",
    "on_timeout": "UNKNOWN_OUTCOME_TIMEOUT_",
}
# The approval policy's `expiry` is its expiry_seconds, given as a duration.
_POLICY = agent_pb2.AgentSpec.DESCRIPTOR.fields_by_name["approval"].message_type
# The unknown-outcome policy's `every` is its every_seconds, given as a duration.
_UNKNOWN = agent_pb2.AgentSpec.DESCRIPTOR.fields_by_name["unknown_outcome"].message_type
_ALIASES: Aliases = {_POLICY: {"expiry": "expiry_seconds"}, _UNKNOWN: {"every": "every_seconds"}}


# The file cannot be read as an agent; the message names the file and what is wrong. It is the
# error tool files raise too (ToolFileError is one): a tool written inside an agent file is
# read by tool_files.py, and the CLI reports both alike.
AgentFileError = SpecFileError


@dataclass(frozen=True)
class AgentFile:
    agent_id: str
    display_name: str
    spec: agent_pb2.AgentSpec
    acknowledge_trifecta: bool
    # The tool definitions written inside the file, saved before the spec is published.
    tools: tuple[tool_pb2.Tool, ...] = ()


def load(path: str) -> AgentFile:
    """Read and check an agent file (`-` reads standard input)."""
    try:
        text = read_text(path)
        doc = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as err:
        raise AgentFileError(f"{path}: cannot read it: {err}") from None
    except RecursionError:  # the reader recurses once a level
        raise AgentFileError(f"{path}: cannot read it: nested too deeply") from None
    return parse(doc, path)


def parse(doc: Any, source: str = "agent file") -> AgentFile:
    if not isinstance(doc, dict):
        raise AgentFileError(f"{source}: expected a mapping of keys (agent, model, tools, ...)")
    spec_doc = {k: v for k, v in doc.items() if k not in FILE_KEYS}
    defined = _defined_tools(spec_doc, source)
    unknown = unknown_keys(spec_doc, agent_pb2.AgentSpec.DESCRIPTOR, FILE_KEYS, aliases=_ALIASES)
    if unknown:
        raise AgentFileError(f"{source}: unknown keys: {'; '.join(unknown)}")
    agent_id = doc.get("agent")
    if not isinstance(agent_id, str) or not agent_id:
        raise AgentFileError(f"{source}: `agent: <id>` is required (the agent's id)")
    spec = agent_pb2.AgentSpec()
    try:
        json_format.ParseDict(_normalise(spec_doc), spec)
    except (json_format.ParseError, ValueError, TypeError) as err:
        raise AgentFileError(f"{source}: {err}") from None
    return AgentFile(
        agent_id=agent_id,
        display_name=str(doc.get("name") or ""),
        spec=spec,
        acknowledge_trifecta=bool(doc.get("acknowledge_trifecta", False)),
        tools=defined,
    )


def _defined_tools(spec_doc: dict[str, Any], source: str) -> tuple[tool_pb2.Tool, ...]:
    """The definitions among `tools` (replaced by their names in `spec_doc`)."""
    entries = spec_doc.get("tools")
    if not isinstance(entries, list):
        return ()
    defined = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict):
            defined.append(tool_files.parse(entry, f"{source}: tools[{i}]"))
    spec_doc["tools"] = [e.get("name") if isinstance(e, dict) else e for e in entries]
    return tuple(defined)


def _normalise(doc: dict[str, Any]) -> dict[str, Any]:
    """Durations to protobuf's `Ns`, short enum names to full ones, `expiry` to seconds."""
    out = dict(doc)
    limits = out.get("limits")
    if isinstance(limits, dict):
        out["limits"] = {
            k: _proto_duration(durations.field(v, f"limits.{k}")) if k in _DURATIONS else v
            for k, v in limits.items()
        }
    approval = out.get("approval")
    if isinstance(approval, dict):
        approval = dict(approval)
        if "expiry" in approval:
            expiry = durations.field(approval.pop("expiry"), "approval.expiry")
            approval["expiry_seconds"] = math.ceil(expiry)
        out["approval"] = _enum(approval, "on_expiry")
    unknown = out.get("unknown_outcome")
    if isinstance(unknown, dict):
        unknown = dict(unknown)
        if "every" in unknown:
            every = durations.field(unknown.pop("every"), "unknown_outcome.every")
            unknown["every_seconds"] = math.ceil(every)
        out["unknown_outcome"] = _enum(unknown, "on_timeout")
    constraints = out.get("constraints")
    if isinstance(constraints, list):
        out["constraints"] = [_rule(c) if isinstance(c, dict) else c for c in constraints]
    if "on_refusal" in out:
        out = _enum(out, "on_refusal")
    return out


def _proto_duration(seconds: float) -> str:
    """protobuf's JSON form of a Duration: `600s`, `0.5s`."""
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


def _rule(item: dict[str, Any]) -> dict[str, Any]:
    for key in ("rule", "value_kind", "action"):
        if key in item:
            item = _enum(item, key)
    return item


def _enum(item: dict[str, Any], key: str) -> dict[str, Any]:
    value = item.get(key)
    prefix = _ENUM_PREFIX[key]
    if isinstance(value, str) and not value.upper().startswith(prefix):
        item = {**item, key: prefix + value.upper()}
    return item


def same_spec(a: agent_pb2.AgentSpec, b: agent_pb2.AgentSpec) -> bool:
    """Whether two specs say the same (what `apply` compares before publishing).

    A stored version holds what the server filled in (an empty `limits.deadline`, an approval
    policy expiring to `reject`), which a file that leaves them out means all the same: a
    plain `==` published a new, identical version at every apply (`agentrun dev --agents`
    applies at every change of its directory)."""
    return _canonical(a) == _canonical(b)


def _canonical(spec: agent_pb2.AgentSpec) -> agent_pb2.AgentSpec:
    out = agent_pb2.AgentSpec()
    out.CopyFrom(spec)
    if out.approval.on_expiry == approval_pb2.EXPIRY_ACTION_REJECT:  # what unspecified means
        out.approval.on_expiry = approval_pb2.EXPIRY_ACTION_UNSPECIFIED
    _drop_empty(out)
    return out


def _drop_empty(message: Message) -> None:
    """Clear every message field (at any depth) that holds nothing but defaults."""
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE or field.is_repeated:
            continue
        _drop_empty(value)
        if value.ByteSize() == 0:
            message.ClearField(field.name)
