"""Outside text and JSON as the control plane can keep them.

Models and tools send what they like. Python's JSON reader takes three things from a
provider's body that go nowhere further: a NUL character and a lone UTF-16 surrogate (from
`\\u0000` and `\\ud83d` escapes), and numbers that are NaN or infinite. Protobuf refuses to
send a string holding a lone surrogate (no UTF-8 has one), Postgres refuses to store a NUL in
text or jsonb, and NaN and Infinity are not JSON: the control plane refuses a commit holding
any of them (control_plane/api/validate.py), and a refused commit fails the run. So such a
value is written as it can be kept: a NUL or a lone surrogate as U+FFFD (the replacement
character), a number that is not finite as its name in a string ("NaN", "Infinity",
"-Infinity"). Everything else is kept as it came.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

REPLACEMENT = "\ufffd"
_UNKEPT = re.compile("[\x00\ud800-\udfff]")
# A NUL as JSON text writes it (json.dumps escapes it; the text of a step never holds one raw).
_NUL_ESCAPE = "\\u0000"


def text(value: str) -> str:
    """`value` with each NUL and lone surrogate replaced (the same object when it has none)."""
    if value.isascii() and "\x00" not in value:
        return value
    return _UNKEPT.sub(REPLACEMENT, value)


def value(data: Any) -> Any:
    """`data` (parsed JSON) with every string, key included, as `text` keeps it, and every
    number that is not finite as its name."""
    if isinstance(data, str):
        return text(data)
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, Mapping):  # keys as JSON writes them, then kept as any string
        return {text(k if isinstance(k, str) else json.dumps(k)): value(v)
                for k, v in data.items()}  # fmt: skip
    if isinstance(data, (list, tuple)):
        return [value(v) for v in data]
    return data


def json_text(data: Any) -> str:
    """`data` as compact JSON text the control plane stores: as json.dumps writes it when
    nothing in it needs keeping as above (the usual case, checked without walking it)."""
    try:
        dumped = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a number that is not finite
        dumped = None
    if dumped is not None and _NUL_ESCAPE not in dumped and (dumped.isascii() or _utf8(dumped)):
        return dumped
    return json.dumps(value(data), ensure_ascii=False, separators=(",", ":"))


def _utf8(dumped: str) -> bool:
    """Whether the text encodes as UTF-8: a lone surrogate is all that does not."""
    try:
        dumped.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
