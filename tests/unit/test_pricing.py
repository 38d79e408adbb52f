"""The price table applied to usage: integer micros, each component rounded up, defaults."""

from __future__ import annotations

import json
import socket

import genai_prices
import pytest

from control_plane.credits import pricing

PRICES = pricing.load()


def test_a_call_is_priced_per_kind_of_token_and_rounded_up_per_component():
    price = PRICES.model("gpt-4o")
    counts = {
        "prompt_tokens": 1000,
        "completion_tokens": 300,
        "cached_tokens": 400,
        "reasoning_tokens": 100,
        "cache_write_tokens": 0,
    }
    usage = pricing.model_call(PRICES, "gpt-4o", counts)
    expected = (
        600 * price.input + 400 * price.cached_input + 200 * price.output + 100 * price.reasoning
    ) // 1_000_000
    assert usage.cost_micros == expected
    assert (usage.input_tokens, usage.output_tokens) == (1000, 300)
    assert (usage.cached_tokens, usage.reasoning_tokens) == (400, 100)
    # One token of a 150-micro-per-million model costs a whole micro, never a fraction.
    one = dict.fromkeys(counts, 0) | {"prompt_tokens": 1}
    assert pricing.model_call(PRICES, "gpt-4o-mini", one).cost_micros == 1


def test_an_unknown_model_is_priced_as_the_default_and_an_unknown_tool_as_tools_default():
    assert PRICES.model("some-new-model") == PRICES.default_model
    assert PRICES.tool("nobody-knows") == PRICES.default_tool
    assert PRICES.tool("send_email") != PRICES.default_tool


def test_commit_steps_sum_and_only_priced_kinds_count():
    decision = json.dumps({"model": "demo", "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
    started = json.dumps({"tool": "send_email"})
    total = pricing.steps_usage(
        PRICES,
        [("model_decision", decision), ("tool_started", started), ("tool_result", "not even json")],
    )
    demo = PRICES.model("demo")
    assert total.cost_micros == -(-10 * demo.input // 10**6) - (
        -5 * demo.output // 10**6
    ) + PRICES.tool("send_email")
    assert total.input_tokens == 10 and total.output_tokens == 5


@pytest.mark.parametrize("bad", [-1, "7", 1.5, True])
def test_bad_usage_is_refused_naming_the_field(bad):
    decision = json.dumps({"model": "demo", "usage": {"prompt_tokens": bad}})
    with pytest.raises(ValueError, match=r"commit\.steps\[0\]\.payload_json\.usage\.prompt_tokens"):
        pricing.steps_usage(PRICES, [("model_decision", decision)])


@pytest.mark.parametrize(
    ("model", "provider"), [("gpt-4o", "openai"), ("claude-sonnet-4", "anthropic")]
)
def test_a_known_model_costs_what_the_maintained_source_says(model, provider):
    """genai-prices' own calculator, a million tokens of each kind, against our table."""
    ours = PRICES.model(model)
    assert ours != PRICES.default_model

    def source(**tokens: int) -> int:
        found = genai_prices.calc_price(genai_prices.Usage(**tokens), model, provider_id=provider)
        return int(found.total_price * 1_000_000)

    million = 1_000_000
    assert ours.input == source(input_tokens=million)
    assert ours.output == source(output_tokens=million)
    assert ours.cached_input == source(input_tokens=million, cache_read_tokens=million)
    assert PRICES.model(f"{provider}/{model}") == ours  # the provider-qualified name too


def test_our_overrides_win_over_the_source_and_the_sandbox_models_share_one_price(tmp_path):
    overrides = json.loads(pricing.TABLE_PATH.read_text())
    overrides["models"]["gpt-4o"] = {"input": 1, "output": 2}
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(overrides))
    table = pricing.load(path)
    assert table.model("gpt-4o") == pricing.ModelPrice.of({"input": 1, "output": 2})
    assert table.model("gpt-4o-mini") == PRICES.model("gpt-4o-mini")  # the rest: the source
    assert table.model("gpt-4o-2024-08-06") == PRICES.model("gpt-4o")  # a name it matches exactly
    # A name of our own the source does not know, kept in the overrides file.
    assert PRICES.model("claude-haiku-3.5") != PRICES.default_model
    sandbox = pricing.ModelPrice.of(overrides["sandbox_price"])
    assert {PRICES.model(name) for name in overrides["sandbox_models"]} == {sandbox}
    assert "demo" in overrides["sandbox_models"]

    def unread() -> dict[str, pricing.ModelPrice]:
        raise AssertionError("the source was read for a name the overrides hold")

    # An override is found without reading the source (a sandbox stack never pays for it).
    assert pricing.load(path, source=unread).model("demo") == sandbox


def test_the_source_is_read_from_the_installed_package_without_the_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the price source tried the network")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    pricing.source_prices.cache_clear()
    try:
        assert pricing.load().model("gpt-4o") == PRICES.model("gpt-4o")
    finally:
        pricing.source_prices.cache_clear()
