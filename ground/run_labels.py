"""A run's tags and metadata (issue 45): what is allowed, checked in one place.

The control plane checks them at StartRun and in ListRuns' filters; the executor checks what a
run's `set_metadata` call asks for before it records the result. Both raise ValueError with a
message that names what is wrong (the control plane answers INVALID_ARGUMENT with it; the
executor records it as the call's error result, which the model reads).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

MAX_TAGS = 20
MAX_TAG_CHARS = 64
MAX_METADATA_BYTES = 4096
_TAG = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
# The metadata filter's key: letters, digits, '_', '-' and '.', like a JSON field name people type.
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def tag(value: str) -> str:
    """One tag, or ValueError saying why it is not one."""
    if not value or len(value) > MAX_TAG_CHARS or not _TAG.match(value):
        raise ValueError(
            f"tag {value[:80]!r} must be 1-{MAX_TAG_CHARS} lowercase letters, digits, "
            "'-' or '_', starting alphanumeric"
        )
    return value


def tags(values: Iterable[str]) -> list[str]:
    """A run's tags: each checked, duplicates dropped (first order kept), at most MAX_TAGS."""
    out = list(dict.fromkeys(tag(v) for v in values))
    if len(out) > MAX_TAGS:
        raise ValueError(f"a run carries at most {MAX_TAGS} tags, not {len(out)}")
    return out


def metadata(value: Any) -> dict[str, Any]:
    """A run's metadata: a JSON object of at most MAX_METADATA_BYTES (compact UTF-8)."""
    if not isinstance(value, Mapping):
        raise ValueError("metadata must be a JSON object")
    size = len(encode(value).encode())
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {size} bytes; at most {MAX_METADATA_BYTES}")
    return dict(value)


def encode(value: Mapping[str, Any]) -> str:
    """The compact JSON text metadata is measured and stored as."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def merged(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`current` with `patch` applied: each key set, a key whose value is null removed."""
    out = dict(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def key_value(text: str) -> tuple[str, str]:
    """ListRuns' metadata filter `key=value` as (key, value)."""
    key, sep, value = text.partition("=")
    if not sep or not _KEY.match(key):
        raise ValueError(
            f"must be key=value, the key 1-128 letters, digits, '_', '-' or '.' (got {text[:80]!r})"
        )
    return key, value
