"""Outside text and JSON as the control plane can keep them.

Models and tools send what they like, and Python's JSON reader takes from a provider's body
things that go nowhere further: a NUL character and a lone UTF-16 surrogate (from `\\u0000`
and `\\ud83d` escapes), numbers that are NaN or infinite, and arrays and objects nested
as deep as the reader goes. Protobuf refuses to send a string holding a lone surrogate (no
UTF-8 has one); Postgres stores no NUL in text or jsonb; NaN and Infinity are not JSON. The
control plane refuses a commit holding any of them, and a refused commit fails the run.
So such a value is written as it can be kept: a NUL or a lone surrogate as U+FFFD (the
replacement character), a number that is not finite as its name in a string ("NaN",
"Infinity", "-Infinity"), and an array or object nested past `MAX_DEPTH` as its JSON text
in a string. Everything else is kept as it came.

`parse` reads outside JSON: a document nested too deeply for Python's reader is not JSON
here (ValueError) instead of a RecursionError nobody expects.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

REPLACEMENT = "\ufffd"
# The deepest outside data may nest in a step: what a caller's JSON may be
# (control_plane/ground/validate.py MAX_JSON_DEPTH), since a tool call's arguments go back to
# callers, who may edit and resend them (approvals); a commit's steps may nest up to 512
# (control_plane/dispatch/session.py MAX_PAYLOAD_DEPTH). `value` recurses this deep at most.
MAX_DEPTH = 64
_UNKEPT = re.compile("[\x00\ud800-\udfff]")
# A NUL as JSON text writes it (json.dumps escapes it; the text of a step never holds one raw).
_NUL_ESCAPE = "\\u0000"


def parse(document: str | bytes) -> Any:
    """json.loads of outside JSON; ValueError for anything that is not JSON to it, a
    document nested past Python's recursion limit included."""
    try:
        return json.loads(document)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def text(value: str) -> str:
    """`value` with each NUL and lone surrogate replaced (the same object when it has none)."""
    if value.isascii() and "\x00" not in value:
        return value
    return _UNKEPT.sub(REPLACEMENT, value)


def value(data: Any, depth: int = 0) -> Any:
    """`data` (parsed JSON, inside `depth` arrays or objects) with every string, key
    included, as `text` keeps it, every number that is not finite as its name, and every
    array or object that would nest deeper than MAX_DEPTH as its JSON text."""
    if isinstance(data, str):
        return text(data)
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, (Mapping, list, tuple)) and depth >= MAX_DEPTH:
        try:
            return text(json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str))
        except (RecursionError, ValueError):  # deeper still than Python writes
            return "[nested too deeply to keep]"
    if isinstance(data, Mapping):  # keys as JSON writes them, then kept as any string
        return {
            text(k if isinstance(k, str) else json.dumps(k)): value(v, depth + 1)
            for k, v in data.items()
        }
    if isinstance(data, (list, tuple)):
        return [value(v, depth + 1) for v in data]
    return data


def json_text(data: Any) -> str:
    """`data` as compact JSON text the control plane stores: as json.dumps writes it when
    nothing in it needs keeping as above (the usual case, checked without walking it)."""
    try:
        dumped = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, RecursionError):  # a number that is not finite; nested very deep
        dumped = None
    if (
        dumped is not None
        and _NUL_ESCAPE not in dumped
        and (dumped.isascii() or _utf8(dumped))
        and (dumped.count("[") + dumped.count("{") <= MAX_DEPTH or _depth(data) <= MAX_DEPTH)
    ):
        return dumped
    return json.dumps(value(data), ensure_ascii=False, separators=(",", ":"))


def _utf8(dumped: str) -> bool:
    """Whether the text encodes as UTF-8: a lone surrogate is all that does not."""
    try:
        dumped.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _depth(data: Any) -> int:
    """How deeply `data`'s arrays and objects nest (walked without recursion)."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        item, above = stack.pop()
        if isinstance(item, Mapping):
            items: Any = item.values()
        elif isinstance(item, (list, tuple)):
            items = item
        else:
            continue
        deepest = max(deepest, above + 1)
        stack.extend((child, above + 1) for child in items)
    return deepest
