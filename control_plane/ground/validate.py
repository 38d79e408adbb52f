"""Request validation: every refusal names the field and what is wrong with it."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from typing import Any

from control_plane.ground.errors import InvalidArgument
from control_plane.store.admission import PRIORITY_MAX, PRIORITY_MIN

_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")  # \Z: `$` would also take "id\n"


def slug(field: str, value: str) -> str:
    """A workspace or agent id: lowercase letters, digits, '-' and '_', 1-63 chars."""
    if not value:
        raise InvalidArgument(field, "is required")
    if not _ID.match(value):
        raise InvalidArgument(
            field, "must be 1-63 lowercase letters, digits, '-' or '_', starting alphanumeric"
        )
    return value


def run_id(field: str, value: str) -> uuid.UUID:
    if not value:
        raise InvalidArgument(field, "is required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"is not a UUID: {value[:64]!r}") from None


def text(field: str, value: str, *, max_bytes: int, required: bool = False) -> str:
    if required and not value:
        raise InvalidArgument(field, "is required")
    size = len(value.encode())
    if size > max_bytes:
        raise InvalidArgument(field, f"is {size} bytes; the limit is {max_bytes}")
    if "\x00" in value:  # Postgres stores no NUL in text (nor in JSON)
        raise InvalidArgument(field, "must not contain a NUL character")
    return value


def unstorable(value: str) -> str | None:
    """What keeps `value` out of a text column or jsonb, said as a refusal's reason; None
    when nothing does. Text from a caller's protobuf is UTF-8 already; text read from an
    outside server's JSON may hold a lone surrogate (from a `\\ud83d` escape)."""
    if "\x00" in value:
        return "contains a NUL character"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone UTF-16 surrogate"
    return None


def in_range(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be between {low} and {high}, got {value}")
    return value


def priority(field: str, value: int) -> int:
    """A run's priority: -100..100 (0 is the default; higher goes first in its workspace)."""
    return in_range(field, value, PRIORITY_MIN, PRIORITY_MAX)


def non_negative(field: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(field, f"must not be negative, got {value}")
    return value


# --- JSON from callers ------------------------------------------------------------------------
#
# Every JSON document a caller sends (a gRPC `*_json` field, an HTTP body, a form's `payload`)
# is read by `json_value` and nothing else. Python's parser recurses once per nesting level, so
# 5,000 nested arrays end in RecursionError; the depth is measured first by a scan that runs in
# C (regular expressions and `accumulate`), never by a Python loop over characters. Postgres
# refuses NUL in text and `\u0000` in jsonb, and a lone UTF-16 surrogate escape (`\ud83d` with
# no low half after it) in either; NaN/Infinity are not JSON at all: all refused here, before
# anything is written.

MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 1024 * 1024

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000", re.IGNORECASE)
# A text that may hold a surrogate escape (the exact check, _lone_surrogate, reads them all).
_SURROGATE_HINT = re.compile(r"\\u[dD][89a-fA-F]")
# Each escape sequence in turn: `\\` consumed whole, so `\\ud83d` is no escape of a surrogate.
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting(text: str) -> int:
    """How deeply the arrays and objects of a JSON text nest (brackets in strings ignored)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _lone_surrogate(text: str) -> bool:
    """Whether a JSON text escapes half a surrogate pair: a high one (\\ud800-\\udbff) not
    followed at once by a low one (\\udc00-\\udfff), or a low one alone. Postgres's jsonb
    refuses it, and no UTF-8 can hold it."""
    if not _SURROGATE_HINT.search(text):
        return False
    high_ends = -1  # where the escape of a high half ended, while its low half is awaited
    for escape in _ESCAPE.finditer(text):
        unit = int(escape.group(1), 16) if escape.group(1) else None
        low = unit is not None and 0xDC00 <= unit <= 0xDFFF
        if high_ends >= 0:
            if not (low and escape.start() == high_ends):
                return True
            high_ends = -1
        elif low:
            return True
        elif unit is not None and 0xD800 <= unit <= 0xDBFF:
            high_ends = escape.end()
    return high_ends >= 0


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_text(
    field: str,
    text: str | bytes,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> str:
    """Check a caller's JSON text without parsing it (for text the database parses): its size,
    nesting depth and NUL escapes. Returns it as str; raises InvalidArgument naming `field`."""
    if len(text) > max_bytes:
        raise InvalidArgument(field, f"is {len(text)} bytes; the limit is {max_bytes}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(field, "is not UTF-8") from None
    if "\x00" in text or ("\\u" in text and _NUL_ESCAPE.search(text)):
        raise InvalidArgument(field, "contains a NUL character")
    if "\\u" in text and _lone_surrogate(text):
        raise InvalidArgument(field, "contains a lone UTF-16 surrogate escape (no text has one)")
    # Cheap first: fewer opening brackets than the limit cannot nest deeper than it.
    if text.count("[") + text.count("{") > max_depth and _nesting(text) > max_depth:
        raise InvalidArgument(field, f"is nested deeper than {max_depth} levels")
    return text


def json_value(
    field: str,
    text: str | bytes,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse a caller's JSON text: bounded in size and depth, no NUL, no NaN or Infinity.

    The one parser for JSON that comes from outside; raises InvalidArgument naming `field`.
    """
    checked = json_text(field, text, max_bytes=max_bytes, max_depth=max_depth)
    try:
        return json.loads(checked, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise InvalidArgument(field, "is not valid JSON") from None
