"""Cheap filter rules applied to an event before any run exists.

A run that would decide to do nothing still costs a model call, so a trigger
may carry rules such as "only mail from senders not in this list" or "only
`invoice.paid` events". Every rule must pass. A rule names a dotted path into
the event document (a webhook's JSON body, a mail's fields), an operator and
an operand; values are compared as text (JSON scalars as they are written:
`true`, `42`, `1.5`). The first rule that fails is the event's visible reason
for being filtered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Operators, with whether they take `value` or `values`.
UNARY = frozenset({"exists", "not_exists"})
SCALAR = frozenset({"equals", "not_equals", "contains", "not_contains"})
LIST = frozenset({"in", "not_in"})
OPS = UNARY | SCALAR | LIST
MAX_RULES = 32
MAX_VALUES = 1000
_MISSING = object()


@dataclass(frozen=True)
class Rule:
    field: str
    op: str
    value: str = ""
    values: tuple[str, ...] = ()
    ignore_case: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "op": self.op,
            "value": self.value,
            "values": list(self.values),
            "ignore_case": self.ignore_case,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rule:
        return cls(
            field=str(data["field"]),
            op=str(data["op"]),
            value=str(data.get("value", "")),
            values=tuple(str(v) for v in data.get("values", ())),
            ignore_case=bool(data.get("ignore_case", False)),
        )


def check(rule: Rule) -> str | None:
    """What is wrong with a rule (for an INVALID_ARGUMENT), or None."""
    if not rule.field or len(rule.field) > 200 or any(not part for part in rule.field.split(".")):
        return "field must be a dotted path of 1-200 characters"
    if rule.op not in OPS:
        return f"op must be one of {', '.join(sorted(OPS))}"
    if rule.op in LIST and not rule.values:
        return f"op {rule.op} needs values"
    if len(rule.values) > MAX_VALUES:
        return f"has {len(rule.values)} values; the limit is {MAX_VALUES}"
    return None


def lookup(document: Any, path: str) -> Any:
    """The value at a dotted path (list items by index), or _MISSING."""
    node = document
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def as_text(value: Any) -> str:
    """How a value is compared: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _passes(rule: Rule, found: Any) -> bool:
    if rule.op in UNARY:
        return (found is not _MISSING) == (rule.op == "exists")
    if found is _MISSING:
        # A missing field equals nothing and contains nothing.
        return rule.op in ("not_equals", "not_contains", "not_in")
    fold = str.casefold if rule.ignore_case else str
    text = fold(as_text(found))
    if rule.op in ("equals", "not_equals"):
        return (text == fold(rule.value)) == (rule.op == "equals")
    if rule.op in ("contains", "not_contains"):
        return (fold(rule.value) in text) == (rule.op == "contains")
    listed = {fold(v) for v in rule.values}
    return (text in listed) == (rule.op == "in")


def first_failure(rules: Sequence[Rule], document: Any) -> str | None:
    """The reason the event is filtered (the first rule it fails), or None when all pass."""
    for i, rule in enumerate(rules):
        if not _passes(rule, lookup(document, rule.field)):
            operand = rule.value if rule.op in SCALAR else f"{len(rule.values)} listed values"
            if rule.op in UNARY:
                operand = ""
            return f"filters[{i}]: {rule.field} {rule.op} {operand}".rstrip()
    return None
