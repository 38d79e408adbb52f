"""Where a proposed call's argument values came from, derived from the run's own log.

A prompt injection works by getting the model to copy a value it read (an
attacker's IBAN, address, link or chat handle) into a call the agent is allowed
to make. The executor cannot tell instructions from data inside the model, but
it can tell where a value appeared: a value that shows up in untrusted content
(a tool's result, an inbound mail or webhook payload) and nowhere in trusted
text (the agent's instructions, a trusted input, a person's message or
decision) was put there by someone outside. Such a value is *marked*, with the
first step it appeared in; an `untrusted_value` constraint decides what a marked
call does (executor/constraints.py).

Pure: a function of the agent version's instructions and the committed step log,
so a resumed run reaches the same decision. Only values specific enough to mean
something are considered (see `values`): an IBAN, a mail address, a URL's
host, a chat handle, a long number or a long token; never `1`, `true` or prose.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agentrun.v1 import run_pb2
from executor import untrusted

INPUT = run_pb2.STEP_KIND_INPUT
RESULT = run_pb2.STEP_KIND_TOOL_RESULT
DECIDED = run_pb2.STEP_KIND_APPROVAL_DECIDED

_IBAN = re.compile(r"\b[A-Z]{2}[0-9]{2}(?:[ ]?[A-Z0-9]){11,30}\b", re.IGNORECASE)
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_URL = re.compile(r"https?://[^\s<>\"')\]]+", re.IGNORECASE)
_HANDLE = re.compile(r"(?<![\w@])([@#][a-z0-9][a-z0-9._-]{2,79})", re.IGNORECASE)
_SQUEEZE = re.compile(r"[\s,]")
# Shorter numbers (amounts, counts) and tokens are too common to mean anything.
MIN_DIGITS = 6
MIN_TOKEN = 10
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/+=-]*$")


@dataclass(frozen=True)
class Value:
    """One meaningful value in an argument: `kind` says how it is compared."""

    argument: str  # the argument's name, a dotted path inside nested arguments
    kind: str  # iban | email | host | handle | number | token
    value: str  # normalised


@dataclass(frozen=True)
class Origin:
    """A marked value and the first untrusted step it appeared in."""

    value: Value
    seq: int
    step_kind: str  # tool_result | input
    tool: str

    @property
    def summary(self) -> str:
        if self.step_kind == "tool_result":
            return f"first appeared in the result of `{self.tool}` step {self.seq}"
        return f"first appeared in the run's untrusted input (step {self.seq})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "argument": self.value.argument,
            "value": self.value.value,
            "seq": self.seq,
            "step_kind": self.step_kind,
            "tool": self.tool,
            "untrusted": True,
            "summary": self.summary,
        }


def iban(text: str) -> str | None:
    """`text` as an IBAN (no spaces, upper case) when its mod-97 check digits hold."""
    value = re.sub(r"\s", "", text).upper()
    if not re.fullmatch(r"[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}", value):
        return None
    digits = "".join(str(int(c, 36)) for c in value[4:] + value[:4])
    return value if int(digits) % 97 == 1 else None


def host(url: str) -> str | None:
    """The lower-case host of an http(s) URL; None when it is not one."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname.lower().rstrip(".")


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item, path)
    else:
        yield path, value


def values(arguments: Mapping[str, Any], only: str = "") -> list[Value]:
    """The meaningful values in a call's arguments (`only`: one argument's)."""
    source: Mapping[str, Any] = {only: arguments.get(only)} if only else arguments
    found: dict[tuple[str, str], Value] = {}
    for path, leaf in _leaves(source, ""):
        for v in _of_leaf(path, leaf):
            found.setdefault((v.kind, v.value), v)
    return list(found.values())


def _number(path: str, leaf: float) -> Iterator[Value]:
    text = str(int(leaf)) if float(leaf).is_integer() else repr(leaf)
    if sum(c.isdigit() for c in text) >= MIN_DIGITS:
        yield Value(path, "number", text.lstrip("-"))


def _of_leaf(path: str, leaf: Any) -> Iterator[Value]:
    if isinstance(leaf, bool) or leaf is None:
        return
    if isinstance(leaf, int | float):
        yield from _number(path, leaf)
        return
    text = str(leaf)
    for match in _IBAN.finditer(text):
        if (found := iban(match.group(0))) is not None:
            yield Value(path, "iban", found)
    for match in _EMAIL.finditer(text):
        yield Value(path, "email", match.group(0).lower())
    for match in _URL.finditer(text):
        if (h := host(match.group(0))) is not None:
            yield Value(path, "host", h)
    for match in _HANDLE.finditer(text):
        yield Value(path, "handle", match.group(1).lower())
    whole = _whole(text.strip())
    if whole is not None:
        yield Value(path, *whole)


def _whole(text: str) -> tuple[str, str] | None:
    """The whole string as one value: a long number, or a long token (an id, a code)."""
    squeezed = _SQUEEZE.sub("", text)
    if squeezed.isdigit() and len(squeezed) >= MIN_DIGITS:
        return "number", squeezed
    plain = len(text) >= MIN_TOKEN and _TOKEN.match(text) is not None
    if plain and iban(text) is None and not _EMAIL.fullmatch(text) and not _URL.match(text):
        return "token", text.lower()
    return None


@dataclass(frozen=True)
class _Text:
    """One source of text, in the two forms values are looked up in."""

    lower: str
    squeezed: str  # lower case, without whitespace and commas (IBANs, numbers)

    @classmethod
    def of(cls, text: str) -> _Text:
        lower = text.lower()
        return cls(lower, _SQUEEZE.sub("", lower))

    def has(self, v: Value) -> bool:
        if v.kind in ("iban", "number"):
            return v.value.lower() in self.squeezed
        return v.value in self.lower


def _participants(payload: Mapping[str, Any]) -> str:
    """The sender and recipients of the mail that triggered the run, as one text."""
    trigger = payload.get("trigger")
    mail = trigger.get("mail") if isinstance(trigger, Mapping) else None
    if not isinstance(mail, Mapping):
        return ""
    return " ".join(_dump(mail.get(k) or "") for k in ("from", "to", "cc"))


def _dump(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class _Source:
    seq: int
    step_kind: str
    tool: str
    text: _Text


class Ledger:
    """Trusted and untrusted text of a run so far, read from its log."""

    def __init__(self, instructions: str, entries: Iterable[Any]) -> None:
        trusted = [instructions]
        self._untrusted: list[_Source] = []
        for entry in entries:
            payload = entry.payload
            if entry.kind == INPUT:
                for item in payload.get("history") or []:
                    if isinstance(item, Mapping) and item.get("role") == "user":
                        trusted.append(str(item.get("content") or ""))
                if untrusted.input_source(payload) is None:
                    trusted.append(str(payload.get("text", "")))
                else:
                    text = _Text.of(_dump(dict(payload)))
                    self._untrusted.append(_Source(entry.seq, "input", "", text))
                    # Replying to the triggering mail's people is the normal task (the thread
                    # rules govern it): its envelope is not an injected value.
                    trusted.append(_participants(payload))
            elif entry.kind == RESULT:
                if payload.get("refused_by") or payload.get("decided_by"):
                    # Our own refusal, or a person's decision on an unknown outcome.
                    if payload.get("decided_by"):
                        trusted.append(str(payload.get("note") or ""))
                    continue
                body = _dump(payload.get("output")) + "\n" + _dump(payload.get("error") or "")
                tool = str(payload.get("tool", ""))
                self._untrusted.append(_Source(entry.seq, "tool_result", tool, _Text.of(body)))
            elif entry.kind == DECIDED:
                # A person's decision: an edit is theirs, and so is their reason.
                trusted.append(_dump(payload.get("arguments") or ""))
                trusted.append(str(payload.get("reason") or ""))
        self._trusted = [_Text.of(t) for t in trusted if t]

    def origin(self, v: Value) -> Origin | None:
        """Where `v` first appeared, when only untrusted content has it; None otherwise."""
        if any(t.has(v) for t in self._trusted):
            return None
        for source in self._untrusted:
            if source.text.has(v):
                return Origin(v, source.seq, source.step_kind, source.tool)
        return None

    def marked(self, arguments: Mapping[str, Any], only: str = "") -> list[Origin]:
        """Every marked value in the arguments, in argument order."""
        return [o for v in values(arguments, only) if (o := self.origin(v)) is not None]
