"""Canonical JSON of tool arguments and its SHA-256 (the executor computes the same)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_sha256(arguments: Any) -> str:
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()
