"""A stand-in for a provider's prompt cache, so usage reports cached tokens honestly.

A request is a sequence of parts (tools, system blocks, messages) and a list
of breakpoints, indices after which a prefix may be cached. The longest prefix
ending at a breakpoint that an earlier request also ended a breakpoint at is
read from the cache; the longest prefix of this request is written when it is
new. OpenAI caches automatically (every message boundary is a breakpoint and
writes are not reported); Anthropic caches only where the request says
`cache_control`. Unlike the real services there is no minimum length (1,024
tokens) and no expiry: the sandbox should show that caching is asked for, not
model its economics.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class CacheUse:
    total: int  # tokens of the whole prompt
    read: int  # of which served from the cache
    written: int  # of which written to the cache by this request


class PromptCache:
    def __init__(self, count_tokens: Callable[[str], int]) -> None:
        self._count = count_tokens
        self._seen: set[str] = set()

    def use(self, parts: Sequence[Any], breakpoints: Sequence[int]) -> CacheUse:
        """Tokens of the prompt, read and written; `breakpoints`: prefix lengths (1-based).

        A read may end at any part up to the last breakpoint (Anthropic looks back
        from a breakpoint for a shorter prefix written earlier); writes happen only
        at breakpoints.
        """
        parts = [_unmarked(part) for part in parts]  # marks are no content (nor tokens)
        longest = max(breakpoints, default=0)
        digest = hashlib.sha256()
        prefixes: list[str] = []
        for part in parts[:longest]:
            digest.update(json.dumps(part, sort_keys=True).encode())
            digest.update(b"\x00")
            prefixes.append(digest.hexdigest())
        total = self._count(json.dumps(list(parts)))
        hit = max((n for n, key in enumerate(prefixes, start=1) if key in self._seen), default=0)
        read = self._tokens(parts, hit) if hit else 0
        written = 0
        if longest and hit < longest:
            written = self._tokens(parts, longest) - read
        if len(self._seen) > MAX_ENTRIES:
            self._seen.clear()
        self._seen.update(prefixes[n - 1] for n in set(breakpoints) if 0 < n <= longest)
        return CacheUse(total=max(total, read + written), read=read, written=max(0, written))

    def _tokens(self, parts: Sequence[Any], length: int) -> int:
        return self._count(json.dumps(list(parts[:length])))


def _unmarked(value: Any) -> Any:
    """The part without its `cache_control` marks: where a breakpoint sits is no content."""
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value
