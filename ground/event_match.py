"""Match expressions: which events a wait (or a cancel-on) is for.

A small, safe language, parsed here and never evaluated by Python's own eval:

    event.customer == run.input.customer and event.kind == "paid"

An expression is one or more comparisons joined by `and` (or `&&`); each compares an event
path (`event.` then one or more names) with a run path (`run.input` then names: the run's
input read as a JSON object) or a literal (a string in single or double quotes, a number,
`true`, `false`, `null`), either way round. An empty expression matches every event of the
name. Nothing else parses, and the error says where.

The run side is evaluated when the wait starts (`bind`), so the stored wait key is concrete:
the event paths and the values they must have, as [path, value] pairs sorted by path. An
event matches a key when projecting its body onto the key's paths (its shape) gives that key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_EXPRESSION = 1000
MAX_COMPARISONS = 10
_NAME = r"[A-Za-z_][A-Za-z0-9_-]{0,63}"
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<path>(?:event|run)(?:\."""
    + _NAME
    + r""")*)(?![A-Za-z0-9_.-])
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<op>==|&&)
      | (?P<word>[A-Za-z_]+)
    )""",
    re.VERBOSE,
)
_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None}


class ExpressionError(ValueError):
    """An expression that does not parse, or whose run side the run cannot supply."""


@dataclass(frozen=True)
class Literal:
    value: Any


@dataclass(frozen=True)
class RunPath:
    path: tuple[str, ...]  # after `run.input`


@dataclass(frozen=True)
class Comparison:
    event_path: str  # dot-joined, after `event.`
    other: Literal | RunPath


@dataclass(frozen=True)
class Match:
    comparisons: tuple[Comparison, ...]

    @property
    def uses_run(self) -> bool:
        return any(isinstance(c.other, RunPath) for c in self.comparisons)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ExpressionError(f"cannot read {text[pos:].strip()[:20]!r} at character {pos}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _operand(kind: str, value: str) -> Literal | RunPath | str:
    """A literal, a run path, or an event path (as its dot-joined text)."""
    if kind == "string":
        body = value[1:-1]
        if value[0] == "'":
            body = body.replace('\\"', '"').replace("\\'", "'").replace('"', '\\"')
        try:
            return Literal(json.loads(f'"{body}"'))
        except json.JSONDecodeError as exc:
            raise ExpressionError(f"bad string {value}") from exc
    if kind == "number":
        return Literal(json.loads(value))
    if kind == "word" and value in _WORDS:
        return Literal(_WORDS[value])
    if kind == "path":
        parts = value.split(".")
        if parts[0] == "event":
            if len(parts) < 2:
                raise ExpressionError("`event` needs a field: event.NAME")
            return ".".join(parts[1:])
        if len(parts) < 2 or parts[1] != "input":
            raise ExpressionError(f"unknown run field {value!r}: only run.input[.NAME...]")
        return RunPath(tuple(parts[2:]))
    raise ExpressionError(f"unexpected {value!r}: expected event.NAME, run.input…, or a literal")


def parse(text: str) -> Match:
    """The expression, checked (ExpressionError says what is wrong)."""
    if len(text) > MAX_EXPRESSION:
        raise ExpressionError(f"is longer than {MAX_EXPRESSION} characters")
    tokens = _tokens(text)
    if not tokens:
        return Match(())
    comparisons: list[Comparison] = []
    i = 0
    while True:
        if i + 3 > len(tokens) or tokens[i + 1] != ("op", "=="):
            raise ExpressionError(
                "expected comparisons `A == B` joined by `and`, e.g. "
                "event.customer == run.input.customer"
            )
        left, right = _operand(*tokens[i]), _operand(*tokens[i + 2])
        if isinstance(left, str) and not isinstance(right, str):
            comparisons.append(Comparison(left, right))
        elif isinstance(right, str) and not isinstance(left, str):
            comparisons.append(Comparison(right, left))
        else:
            raise ExpressionError(
                "each comparison needs exactly one event.NAME side (and a run.input path or "
                "a literal on the other)"
            )
        i += 3
        if i == len(tokens):
            break
        if tokens[i] not in (("word", "and"), ("op", "&&")):
            raise ExpressionError(f"expected `and` after a comparison, not {tokens[i][1]!r}")
        i += 1
    if len(comparisons) > MAX_COMPARISONS:
        raise ExpressionError(f"has more than {MAX_COMPARISONS} comparisons")
    return Match(tuple(comparisons))


def run_input(text: str) -> Any:
    """The run's input as JSON, or None when it is not JSON."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None


_MISSING = object()


def _at(value: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(value, Mapping) or name not in value:
            return _MISSING
        value = value[name]
    return value


def bind(match: Match, run_input_value: Any) -> list[list[Any]]:
    """The concrete key: [event path, value] pairs sorted by path, the run side read from
    the run's input (ExpressionError: the input lacks a path, or two values contradict)."""
    pairs: dict[str, Any] = {}
    for c in match.comparisons:
        if isinstance(c.other, Literal):
            value = c.other.value
        else:
            value = _at(run_input_value, c.other.path)
            if value is _MISSING:
                where = ".".join(("run", "input", *c.other.path))
                raise ExpressionError(f"{where} is not in the run's input (a JSON object)")
        if c.event_path in pairs and pairs[c.event_path] != value:
            raise ExpressionError(f"event.{c.event_path} cannot equal two values")
        pairs[c.event_path] = value
    return [[path, pairs[path]] for path in sorted(pairs)]


def shape(key: list[list[Any]]) -> list[str]:
    """The event paths a key compares, sorted."""
    return [str(p[0]) for p in key]


def project(body: Mapping[str, Any], paths: list[str]) -> list[list[Any]] | None:
    """The event body's key for a shape; None when the body lacks one of its paths."""
    out: list[list[Any]] = []
    for path in paths:
        value = _at(body, tuple(path.split(".")))
        if value is _MISSING:
            return None
        out.append([path, value])
    return out


def containment(key: list[list[Any]]) -> dict[str, Any]:
    """A JSON object that a body matching `key` contains (to narrow a look-back in SQL; the
    match itself is checked with `project`)."""
    out: dict[str, Any] = {}
    for path, value in key:
        node = out
        names = str(path).split(".")
        for name in names[:-1]:
            node = node.setdefault(name, {})
        node[names[-1]] = value
    return out


def same(a: Any, b: Any) -> bool:
    """JSON equality as the database compares jsonb (1 == 1.0; true is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)
