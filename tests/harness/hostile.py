"""Values a hostile provider puts in its JSON (the tool and MCP fuzzers)."""

from __future__ import annotations

import random
from typing import Any


def value(rng: random.Random, keys: tuple[str, ...], depth: int = 0) -> Any:
    """Any JSON-ish value: NaN and infinities, NUL and lone surrogates, long text, lists and
    objects (keyed from `keys`) a few levels deep, or arrays nested 600 deep."""
    pick = rng.randrange(9)
    if pick == 0:
        return rng.choice([None, True, 0, -1, 10**30, 1.5, float("nan"), float("-inf")])
    if pick == 1:
        return rng.choice(["", "a\x00b", "half \ud83d", "é\u2028", "x" * 5000])
    if pick == 2 and depth < 3:
        return [value(rng, keys, depth + 1) for _ in range(rng.randrange(4))]
    if pick == 3 and depth < 3:
        return {rng.choice(keys): value(rng, keys, depth + 1) for _ in range(3)}
    if pick == 4:
        deep: Any = "bottom"
        for _ in range(600):
            deep = [deep]
        return deep
    return rng.choice([{}, [], "", 0])
