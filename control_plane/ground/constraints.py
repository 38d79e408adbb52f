"""Argument constraints of an agent spec: validated at publish, stored as JSON with the version.

The executor enforces them (executor/constraints.py); here they are only
checked for shape, so that a version that cannot be enforced is never stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from agentrun.v1 import agent_pb2
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument

MAX_CONSTRAINTS = 64
MAX_KNOWN = 1000
# The argument a VALUE_ALLOWED rule reads when it names none (executor/constraints.py's
# DEFAULT_ARGUMENT; the control plane needs it to look up "seen before" values).
DEFAULT_ARGUMENT = {
    agent_pb2.VALUE_KIND_IBAN: "iban",
    agent_pb2.VALUE_KIND_EMAIL: "to",
    agent_pb2.VALUE_KIND_URL: "url",
    agent_pb2.VALUE_KIND_CHAT: "channel",
    agent_pb2.VALUE_KIND_ID: "id",
}
RULES = {
    agent_pb2.CONSTRAINT_RULE_REPLY_TO_TRIGGER_THREAD: "reply_to_trigger_thread",
    agent_pb2.CONSTRAINT_RULE_ATTACHMENTS_FROM_TRIGGER_THREAD: "attachments_from_trigger_thread",
    agent_pb2.CONSTRAINT_RULE_RECIPIENT_KNOWN_OR_APPROVAL: "recipient_known_or_approval",
    agent_pb2.CONSTRAINT_RULE_AMOUNT_AT_MOST: "amount_at_most",
    agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED: "value_allowed",
    agent_pb2.CONSTRAINT_RULE_UNTRUSTED_VALUE: "untrusted_value",
}
RULE_VALUES = {name: value for value, name in RULES.items()}
KINDS = {
    agent_pb2.VALUE_KIND_IBAN: "iban",
    agent_pb2.VALUE_KIND_EMAIL: "email",
    agent_pb2.VALUE_KIND_URL: "url",
    agent_pb2.VALUE_KIND_CHAT: "chat",
    agent_pb2.VALUE_KIND_ID: "id",
}
KIND_VALUES = {name: value for value, name in KINDS.items()}
ACTIONS = {
    agent_pb2.CONSTRAINT_ACTION_REFUSE: "refuse",
    agent_pb2.CONSTRAINT_ACTION_HOLD: "hold",
    agent_pb2.CONSTRAINT_ACTION_ALLOW: "allow",
}
ACTION_VALUES = {name: value for value, name in ACTIONS.items()}
ON_REFUSAL = {
    agent_pb2.ON_REFUSAL_RETRY: "retry",
    agent_pb2.ON_REFUSAL_FAIL: "fail",
    agent_pb2.ON_REFUSAL_ASK: "ask",
}
ON_REFUSAL_VALUES = {name: value for value, name in ON_REFUSAL.items()}
_IBAN = re.compile(r"[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}")
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$")
_ADDRESS = re.compile(r"^[^@\s]+@[a-z0-9.-]+\.[a-z]{2,}$")
_CHAT = re.compile(r"^[@#]?[a-z0-9][a-z0-9._-]{0,79}$")


def normalise_allowed(kind: int, entry: str) -> str:
    """An allowlist entry in the form the executor compares (IBANs without spaces, upper case;
    the rest lower case; a URL entry as its domain)."""
    if kind == agent_pb2.VALUE_KIND_IBAN:
        return re.sub(r"\s", "", entry).upper()
    if kind == agent_pb2.VALUE_KIND_URL:
        host = entry.strip().lower()
        if "://" in host:
            host = urlsplit(host).hostname or ""
        return host.removeprefix("*.").removeprefix(".").rstrip(".")
    if kind == agent_pb2.VALUE_KIND_ID:
        return entry.strip()
    return entry.strip().lower()


def _iban_ok(value: str) -> bool:
    if not _IBAN.fullmatch(value):
        return False
    digits = "".join(str(int(c, 36)) for c in value[4:] + value[:4])
    return int(digits) % 97 == 1


_ENTRY_OK = {
    agent_pb2.VALUE_KIND_IBAN: (_iban_ok, "an IBAN with valid check digits"),
    agent_pb2.VALUE_KIND_EMAIL: (
        lambda v: bool(_ADDRESS.match(v) or (v.startswith("@") and _DOMAIN.match(v[1:]))),
        "an address or @domain",
    ),
    agent_pb2.VALUE_KIND_URL: (lambda v: bool(_DOMAIN.match(v)), "a domain or an http(s) URL"),
    agent_pb2.VALUE_KIND_CHAT: (lambda v: bool(_CHAT.match(v)), "a chat user (@name) or channel"),
    agent_pb2.VALUE_KIND_ID: (lambda v: bool(v), "an id"),
}


_LIST_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def validate_allowlist(where: str, name: str, values: list[str]) -> None:
    """A workspace allowlist (SetAllowlist): its name, and at most MAX_KNOWN values (they
    are read as the naming rule's value kind, so no kind is checked here)."""
    if not _LIST_NAME.match(name):
        raise InvalidArgument(f"{where}.name", "must be 1 to 64 of a-z, 0-9, _ and -")
    if len(values) > MAX_KNOWN:
        raise InvalidArgument(f"{where}.values", f"has more than {MAX_KNOWN}")
    for j, value in enumerate(values):
        validate.text(f"{where}.values[{j}]", value, max_bytes=320, required=True)


def _validate_valued(where: str, c: agent_pb2.ToolConstraint) -> None:
    """The fields of value_allowed and untrusted_value rules."""
    if c.action and c.action not in ACTIONS:
        raise InvalidArgument(f"{where}.action", "must be refuse, hold or allow")
    if c.rule == agent_pb2.CONSTRAINT_RULE_UNTRUSTED_VALUE:
        if c.or_seen_before:
            raise InvalidArgument(f"{where}.or_seen_before", "is for VALUE_ALLOWED")
        if c.workspace_list:
            raise InvalidArgument(f"{where}.workspace_list", "is for VALUE_ALLOWED")
        return
    if c.action == agent_pb2.CONSTRAINT_ACTION_ALLOW:
        raise InvalidArgument(f"{where}.action", "allow makes no sense for VALUE_ALLOWED")
    if c.value_kind not in KINDS:
        raise InvalidArgument(f"{where}.value_kind", "must name a value kind for VALUE_ALLOWED")
    if c.workspace_list and not _LIST_NAME.match(c.workspace_list):
        raise InvalidArgument(f"{where}.workspace_list", "must be 1 to 64 of a-z, 0-9, _ and -")
    sources = c.allowed or c.or_seen_before or c.workspace_list
    if not sources and c.value_kind != agent_pb2.VALUE_KIND_EMAIL:
        raise InvalidArgument(
            f"{where}.allowed",
            "must list at least one value (or or_seen_before, or a workspace_list)",
        )
    _validate_allowed(where, c)


def _validate_allowed(where: str, c: agent_pb2.ToolConstraint) -> None:
    """A VALUE_ALLOWED rule's own allowlist: each entry of its value kind."""
    if len(c.allowed) > MAX_KNOWN:
        raise InvalidArgument(f"{where}.allowed", f"has more than {MAX_KNOWN}")
    ok, what = _ENTRY_OK[c.value_kind]
    for j, entry in enumerate(c.allowed):
        validate.text(f"{where}.allowed[{j}]", entry, max_bytes=320, required=True)
        if not ok(normalise_allowed(c.value_kind, entry)):
            raise InvalidArgument(f"{where}.allowed[{j}]", f"{entry[:64]!r} is not {what}")


def validate_constraints(spec: agent_pb2.AgentSpec) -> None:
    if spec.on_refusal and spec.on_refusal not in ON_REFUSAL:
        raise InvalidArgument("spec.on_refusal", "must be retry, fail or ask")
    if len(spec.constraints) > MAX_CONSTRAINTS:
        raise InvalidArgument("spec.constraints", f"has more than {MAX_CONSTRAINTS} rules")
    for i, c in enumerate(spec.constraints):
        _validate_one(spec, f"spec.constraints[{i}]", c)


def _validate_one(spec: agent_pb2.AgentSpec, where: str, c: agent_pb2.ToolConstraint) -> None:
    if c.tool not in spec.tools:
        raise InvalidArgument(f"{where}.tool", f"names {c.tool[:64]!r}, not one of spec.tools")
    if c.rule not in RULES:
        raise InvalidArgument(f"{where}.rule", "must name a rule")
    if c.rule in (
        agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED,
        agent_pb2.CONSTRAINT_RULE_UNTRUSTED_VALUE,
    ):
        _validate_valued(where, c)
    elif c.allowed or c.value_kind or c.action or c.or_seen_before or c.workspace_list:
        raise InvalidArgument(
            f"{where}.allowed", "value_kind, allowed and action are for VALUE_ALLOWED"
        )
    validate.text(f"{where}.argument", c.argument, max_bytes=64)
    if c.rule == agent_pb2.CONSTRAINT_RULE_AMOUNT_AT_MOST and c.max_amount <= 0:
        raise InvalidArgument(f"{where}.max_amount", "must be positive for AMOUNT_AT_MOST")
    if len(c.known_recipients) > MAX_KNOWN:
        raise InvalidArgument(f"{where}.known_recipients", f"has more than {MAX_KNOWN}")
    for j, who in enumerate(c.known_recipients):
        validate.text(f"{where}.known_recipients[{j}]", who, max_bytes=320, required=True)


def to_json(constraints: Iterable[agent_pb2.ToolConstraint]) -> list[dict[str, Any]]:
    return [
        {
            "tool": c.tool,
            "rule": RULES[c.rule],
            "argument": c.argument,
            "max_amount": c.max_amount,
            "known_recipients": [who.strip().lower() for who in c.known_recipients],
            # Only when set: other rules keep their stored form.
            **({"value_kind": KINDS[c.value_kind]} if c.value_kind else {}),
            **(
                {"allowed": [normalise_allowed(c.value_kind, v) for v in c.allowed]}
                if c.allowed
                else {}
            ),
            **({"action": ACTIONS[c.action]} if c.action else {}),
            **({"or_seen_before": True} if c.or_seen_before else {}),
            **({"workspace_list": c.workspace_list} if c.workspace_list else {}),
        }
        for c in constraints
    ]


def from_json(data: list[dict[str, Any]]) -> list[agent_pb2.ToolConstraint]:
    return [
        agent_pb2.ToolConstraint(
            tool=c.get("tool", ""),
            rule=RULE_VALUES.get(c.get("rule", ""), 0),  # type: ignore[arg-type]
            argument=c.get("argument", ""),
            max_amount=c.get("max_amount", 0),
            known_recipients=c.get("known_recipients", []),
            value_kind=KIND_VALUES.get(c.get("value_kind", ""), 0),  # type: ignore[arg-type]
            allowed=c.get("allowed", []),
            action=ACTION_VALUES.get(c.get("action", ""), 0),  # type: ignore[arg-type]
            or_seen_before=bool(c.get("or_seen_before", False)),
            workspace_list=c.get("workspace_list", ""),
        )
        for c in data
    ]


def workspace_lists(spec: agent_pb2.AgentSpec) -> list[str]:
    """The workspace allowlists the version's VALUE_ALLOWED rules name."""
    return sorted(
        {
            c.workspace_list
            for c in spec.constraints
            if c.rule == agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED and c.workspace_list
        }
    )


def merge_workspace_lists(spec: agent_pb2.AgentSpec, lists: dict[str, list[str]]) -> None:
    """Add each named workspace list's values to the rules naming it, normalised as the
    rule's own allowlist is (an assignment's copy of the spec: the executor compares them
    as it compares `allowed`). A list the workspace lacks adds nothing (fails closed)."""
    for c in spec.constraints:
        if c.rule == agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED and c.workspace_list:
            c.allowed.extend(
                normalise_allowed(c.value_kind, v) for v in lists.get(c.workspace_list, [])
            )


def seen_before_lookups(spec: agent_pb2.AgentSpec) -> list[tuple[str, str]]:
    """(tool, argument) of each VALUE_ALLOWED rule that also passes values seen before."""
    return sorted(
        {
            (c.tool, c.argument or DEFAULT_ARGUMENT.get(c.value_kind, ""))
            for c in spec.constraints
            if c.rule == agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED and c.or_seen_before
        }
    )
