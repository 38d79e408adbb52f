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
        """Tokens of the prompt, read and written; `breakpoints`: prefix lengths (1-based)."""
        digest = hashlib.sha256()
        prefixes: dict[int, str] = {}
        wanted = set(breakpoints)
        for index, part in enumerate(parts, start=1):
            digest.update(json.dumps(part, sort_keys=True).encode())
            digest.update(b"\x00")
            if index in wanted:
                prefixes[index] = digest.hexdigest()
        total = self._count(json.dumps(list(parts)))
        hits = [n for n, key in prefixes.items() if key in self._seen]
        read = self._tokens(parts, max(hits)) if hits else 0
        longest = max(prefixes, default=0)
        written = 0
        if longest and prefixes[longest] not in self._seen:
            written = self._tokens(parts, longest) - read
        if len(self._seen) > MAX_ENTRIES:
            self._seen.clear()
        self._seen.update(prefixes.values())
        return CacheUse(total=max(total, read + written), read=read, written=max(0, written))

    def _tokens(self, parts: Sequence[Any], length: int) -> int:
        return self._count(json.dumps(list(parts[:length])))
