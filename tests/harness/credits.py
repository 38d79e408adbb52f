"""Credits in tests: a platform admin's grants, the ledger read whole, and the checks that
it balances, computed from the API alone (never from the control plane's own code)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from agentrun.v1 import credit_pb2 as pb
from agentrun.v1 import credit_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import TERMINAL, Api, LoggedStep

PRICES = Path(__file__).parents[2] / "control_plane" / "credits" / "prices.json"
KIND = pb.CreditLedgerEntryKind


class Credits:
    """CreditService as a platform admin (grants) and as the workspace (reads)."""

    def __init__(self, api: Api, platform_key: str) -> None:
        self.api = api
        self.platform = auth.channel(api.channel_target, platform_key)
        self.admin = credit_pb2_grpc.CreditServiceStub(self.platform)
        self.own = credit_pb2_grpc.CreditServiceStub(api.channel)

    @classmethod
    async def connect(cls, api: Api) -> Credits:
        return cls(api, await auth.platform_key(api.db_url))

    async def close(self) -> None:
        await self.platform.close()

    async def grant(self, amount: int, **settings: Any) -> pb.CreditBalance:
        req = pb.GrantCreditsRequest(workspace_id=self.api.ws, amount_micros=amount, **settings)
        return (await self.admin.GrantCredits(req)).balance

    async def balance(self) -> pb.CreditBalance:
        return (await self.own.GetCreditBalance(pb.GetCreditBalanceRequest())).balance

    async def ledger(self, page_size: int = 500) -> list[pb.CreditLedgerEntry]:
        entries: list[pb.CreditLedgerEntry] = []
        token = ""
        while True:
            resp = await self.own.ListCreditLedger(
                pb.ListCreditLedgerRequest(page_size=page_size, page_token=token)
            )
            entries += resp.entries
            if not (token := resp.next_page_token):
                return entries


def _ceil_micros(tokens: int, per_million: int) -> int:
    return (tokens * per_million + 999_999) // 1_000_000


def step_cost(step: LoggedStep, prices: dict[str, Any]) -> int:
    """The price table applied to one recorded step, as control_plane/credits/pricing.py documents
    it, from the overrides file alone: the tests run the sandbox's models, which it prices."""
    if step.kind == "tool_started":
        tools = prices["tools"]
        return int(tools.get(step.payload["tool"], tools["default"]))
    if step.kind != "model_decision":
        return 0
    usage = step.payload.get("usage") or {}
    model = step.payload.get("model")
    if model in prices["sandbox_models"]:  # what the tests run: the sandbox's models
        price = prices["sandbox_price"]
    else:
        price = prices["models"].get(model, prices["default_model"])
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    cached, written = usage.get("cached_tokens", 0), usage.get("cache_write_tokens", 0)
    reasoning = usage.get("reasoning_tokens", 0)
    return (
        _ceil_micros(prompt - cached - written, price["input"])
        + _ceil_micros(cached, price.get("cached_input", price["input"]))
        + _ceil_micros(written, price.get("cache_write", price["input"]))
        + _ceil_micros(completion - reasoning, price["output"])
        + _ceil_micros(reasoning, price.get("reasoning", price["output"]))
    )


def step_costs(steps: list[LoggedStep]) -> list[int]:
    prices = json.loads(PRICES.read_text())
    return [step_cost(s, prices) for s in steps]


def assert_balanced(
    balance: pb.CreditBalance, entries: list[pb.CreditLedgerEntry], runs: list[run_pb2.Run]
) -> None:
    """The account, its ledger and the runs agree to the micro; no chunk was reserved twice."""
    total: Counter[int] = Counter()
    per_run: dict[str, Counter[int]] = defaultdict(Counter)
    chunks: dict[str, list[int]] = defaultdict(list)
    for e in entries:
        total[e.kind] += e.amount_micros
        if e.run_id:
            per_run[e.run_id][e.kind] += e.amount_micros
            if e.kind == KIND.CREDIT_LEDGER_ENTRY_KIND_RESERVE:
                chunks[e.run_id].append(e.chunk)
    grant, reserve = (
        total[KIND.CREDIT_LEDGER_ENTRY_KIND_GRANT],
        total[KIND.CREDIT_LEDGER_ENTRY_KIND_RESERVE],
    )
    spend, release = (
        total[KIND.CREDIT_LEDGER_ENTRY_KIND_SPEND],
        total[KIND.CREDIT_LEDGER_ENTRY_KIND_RELEASE],
    )
    assert balance.granted_micros == grant
    assert balance.balance_micros + balance.reserved_micros + balance.spent_micros == grant
    assert balance.balance_micros == grant - reserve + release
    assert balance.spent_micros == spend
    assert balance.reserved_micros == reserve - spend - release
    for run in runs:
        mine = per_run[run.run_id]
        # Each chunk once, numbered 1..n: a retried reservation took nothing more.
        assert sorted(chunks[run.run_id]) == list(range(1, run.credit_chunks + 1)), run.run_id
        assert mine[KIND.CREDIT_LEDGER_ENTRY_KIND_RESERVE] == run.credits_reserved_micros
        if run.status in TERMINAL:
            assert mine[KIND.CREDIT_LEDGER_ENTRY_KIND_SPEND] == run.counters.cost_micros
            assert mine[KIND.CREDIT_LEDGER_ENTRY_KIND_RELEASE] == (
                run.credits_reserved_micros - run.counters.cost_micros
            )
    if runs and all(r.status in TERMINAL for r in runs):
        assert balance.reserved_micros == 0
        assert balance.spent_micros == sum(r.counters.cost_micros for r in runs)
