"""What a commit costs: the price table applied to the usage its steps record.

The models' prices come from a maintained source, the `genai-prices` package (pydantic's,
pinned in pyproject.toml): the snapshot its wheel ships, read once a process, never fetched
(no network at run time). On top go our overrides, control_plane/credits/prices.json: the
sandbox's scenario models (`sandbox_models`, all at `sandbox_price`), any name or correction
of our own (`models`, which wins over the source), the `default_model` and the tools.
Both are dicts of integer micro-units of a credit (1 credit = 1,000,000 micros = one US
dollar) per million tokens, so a lookup is a dict lookup or two. No floats enter
the ledger: every component of a model call is rounded up to a whole micro on its own, so a
price is exact and repeatable from the step log alone.

A source model is known by its id, each exact name its entry matches (`gpt-4o-2024-08-06`),
and `PROVIDER/NAME` (`openai/gpt-4o`); where providers share a name (a model resold by a
cloud), its maker's price is taken. A source price in tiers is priced at its base tier.

Usage follows the OpenAI meaning, as the executor records it in a model_decision's
`usage`: `prompt_tokens` is the whole prompt, of which `cached_tokens` were read from
the provider's cache and `cache_write_tokens` written to it; `completion_tokens` is the
whole answer, of which `reasoning_tokens` were reasoning. Missing keys are 0. Reasoning
is priced as output and cache writes as input unless the model's entry lists them.

A model neither the source nor the overrides name is priced as `default_model` (a
deliberate, high price: a new model is never free by accident). A tool call is priced when
it is committed as started (once per seq, however often its outcome is retried); a tool
the table does not name costs `tools.default`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from control_plane.store.steps import Usage

TABLE_PATH = Path(__file__).parent / "prices.json"
PER_MILLION = 1_000_000
_USAGE_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cache_write_tokens",
)


@dataclass(frozen=True)
class ModelPrice:
    """Micros per million tokens of each kind."""

    input: int
    output: int
    cached_input: int
    cache_write: int
    reasoning: int

    @classmethod
    def of(cls, entry: Mapping[str, int]) -> ModelPrice:
        return cls(
            input=entry["input"],
            output=entry["output"],
            cached_input=entry.get("cached_input", entry["input"]),
            cache_write=entry.get("cache_write", entry["input"]),
            reasoning=entry.get("reasoning", entry["output"]),
        )


@dataclass(frozen=True)
class PriceTable:
    """`models`: our overrides; `source`: the maintained table, read at its first use."""

    models: Mapping[str, ModelPrice]
    default_model: ModelPrice
    tools: Mapping[str, int]
    default_tool: int
    source: Callable[[], Mapping[str, ModelPrice]] = dict

    def model(self, name: str) -> ModelPrice:
        """An override, else the source's price, else `default_model`: dict lookups."""
        found = self.models.get(name)
        if found is None:
            found = self.source().get(name, self.default_model)
        return found

    def tool(self, name: str) -> int:
        return self.tools.get(name, self.default_tool)


def _micros(tokens: int, per_million: int) -> int:
    """Rounded up: -(-a // b) is the ceiling of a / b in integers."""
    return -(-tokens * per_million // PER_MILLION)


def load(
    path: Path = TABLE_PATH, source: Callable[[], Mapping[str, ModelPrice]] | None = None
) -> PriceTable:
    """Our overrides at `path` over the source's prices (`source_prices` unless given)."""
    data = json.loads(path.read_text())
    tools = dict(data["tools"])
    default_tool = tools.pop("default")
    models = dict.fromkeys(data["sandbox_models"], ModelPrice.of(data["sandbox_price"]))
    models.update({name: ModelPrice.of(entry) for name, entry in data["models"].items()})
    return PriceTable(
        models=models,
        default_model=ModelPrice.of(data["default_model"]),
        tools=tools,
        default_tool=default_tool,
        source=source_prices if source is None else source,
    )


# Makers first: where a name is also a cloud's or a reseller's, the maker's price is taken.
_MAKERS = ("openai", "anthropic", "google", "mistral", "deepseek", "x-ai", "cohere", "meta")


@functools.cache
def source_prices() -> dict[str, ModelPrice]:
    """Every model the genai-prices snapshot prices per token, by each name it is known by.

    Read from the package's own data module (never its network updater) the first time a
    model the overrides do not name is priced (~0.3 s, once a process; a stack that runs
    only the sandbox's models never pays it); prices in effect then, in micros per million
    tokens, each rounded up to a whole micro."""
    from genai_prices import data

    now = datetime.now(UTC)
    order = {maker: i for i, maker in enumerate(_MAKERS)}
    providers = sorted(data.providers, key=lambda p: order.get(p.id, len(_MAKERS)))
    prices: dict[str, ModelPrice] = {}
    for provider in providers:
        for model in provider.models:
            price = _from_source(model.get_prices(now))
            if price is None:
                continue
            for name in (model.id, *_exact_names(model.match)):
                prices.setdefault(name, price)
                prices.setdefault(f"{provider.id}/{name}", price)
    return prices


def _from_source(price: Any) -> ModelPrice | None:
    """A source price (US dollars per million tokens) in micros; None if not per token."""

    def micros(key: str) -> int | None:
        value = getattr(price, key, None)
        value = getattr(value, "base", value)  # tiers: the base tier
        return None if value is None else math.ceil(Decimal(value) * PER_MILLION)

    entry = {
        ours: found
        for ours, theirs in (
            ("input", "input_mtok"),
            ("output", "output_mtok"),
            ("cached_input", "cache_read_mtok"),
            ("cache_write", "cache_write_mtok"),
        )
        if (found := micros(theirs)) is not None
    }
    if "input" not in entry or "output" not in entry:
        return None  # embeddings, images, audio: not what a model_decision is
    return ModelPrice.of(entry)


def _exact_names(match: Any) -> Iterator[str]:
    """The names a source entry's match logic accepts exactly (its `equals` clauses)."""
    if isinstance(equals := getattr(match, "equals", None), str):
        yield equals
    for clause in getattr(match, "or_", ()):
        yield from _exact_names(clause)


@functools.cache
def table() -> PriceTable:
    """The server's table, read once."""
    return load()


def tokens_of(usage: Mapping[str, Any], where: str) -> dict[str, int]:
    """A decision's usage counts (missing: 0); raises ValueError naming a bad one."""
    counts = {}
    for key in _USAGE_KEYS:
        value = usage.get(key, 0) or 0
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}.usage.{key}: is not a non-negative integer")
        counts[key] = value
    return counts


def model_call(prices: PriceTable, model: str, counts: Mapping[str, int]) -> Usage:
    """One model call's usage and cost."""
    price = prices.model(model)
    prompt, completion = counts["prompt_tokens"], counts["completion_tokens"]
    cached, written = counts["cached_tokens"], counts["cache_write_tokens"]
    reasoning = counts["reasoning_tokens"]
    cost = (
        _micros(max(prompt - cached - written, 0), price.input)
        + _micros(cached, price.cached_input)
        + _micros(written, price.cache_write)
        + _micros(max(completion - reasoning, 0), price.output)
        + _micros(reasoning, price.reasoning)
    )
    return Usage(prompt, completion, cached, reasoning, cost)


def step_usage(prices: PriceTable, kind: str, payload: Mapping[str, Any], where: str) -> Usage:
    """What one committed step costs: a model decision by its usage, a started tool call
    by its tool; every other kind nothing."""
    if kind == "model_decision":
        usage = payload.get("usage") or {}
        if not isinstance(usage, Mapping):
            raise ValueError(f"{where}.usage: is not an object")
        return model_call(prices, str(payload.get("model") or ""), tokens_of(usage, where))
    if kind == "tool_started":
        return Usage(cost_micros=prices.tool(str(payload.get("tool") or "")))
    return Usage()


PRICED_KINDS = frozenset({"model_decision", "tool_started"})


def steps_usage(prices: PriceTable, steps: Iterable[tuple[str, str]]) -> Usage:
    """The usage of (kind, payload JSON) steps; only priced kinds are parsed."""
    total = Usage()
    for i, (kind, payload_json) in enumerate(steps):
        if kind in PRICED_KINDS:
            where = f"commit.steps[{i}].payload_json"
            payload = json.loads(payload_json)
            if not isinstance(payload, Mapping):
                raise ValueError(f"{where}: is not an object")
            total += step_usage(prices, kind, payload, where)
    return total


def priced(steps: Iterable[tuple[str, str]]) -> Usage:
    """What a commit's (kind, payload JSON) steps cost by the server's table: the price the
    commit pipeline is given where the server is assembled."""
    return steps_usage(table(), steps)
