"""Keyed and lookup writes against the real provider sandbox: settled by class, applied once.

Faults are armed for one run's calls only (by its key prefix) before any
executor runs; crashes are SIGKILLs at named fault points.
"""

from __future__ import annotations

import json

import pytest

from agentrun.v1 import run_pb2
from executor.tools.catalogue import DEFAULT_PATH
from tests.harness.agentrun_api import (
    Api,
    AutoApprover,
    clear_faults,
    sandbox_effects,
    sandbox_requests,
    set_fault,
)
from tests.harness.idp import member_signed_in
from tests.harness.waiting import eventually


@pytest.fixture
async def stack(db_url, control_plane, sandbox_providers, sandbox_idp):
    cp = control_plane(db_url, AGENTRUN_OIDC_ISSUER=sandbox_idp.url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("charger", "charger", ["create_charge"])
    await api.publish("writer", "writer", ["crm_lookup", "send_email", "echo"])
    md = await member_signed_in(db_url, sandbox_idp.url)
    async with AutoApprover(api, metadata=md):  # create_charge moves money: a person approves each
        yield cp, api
    await api.close()
    clear_faults(sandbox_providers.url)


def mine(entries: list[dict], run_id: str, path: str | None = None) -> list[dict]:
    """The run's entries of a sandbox log or effect list (by their key), at `path` if given."""
    return [
        e
        for e in entries
        if (e.get("idempotency_key") or e.get("key") or "").startswith(f"{run_id}:")
        and (path is None or e.get("path") == path)
    ]


async def test_a_charge_whose_key_is_still_in_use_is_sent_again_until_the_replay_answers(
    stack, executor_factory, sandbox_providers
):
    cp, api = stack
    url = sandbox_providers.url
    run_id = await api.start("charger", "lin")
    # The first request takes 2 s at the provider; the executor gives up after 0.5 s.
    set_fault(
        url, provider="payments", mode="delay", delay_ms=2000, key_prefix=f"{run_id}:", count=1
    )
    executor_factory(cp, AGENTRUN_TOOL_TIMEOUT_SECONDS="0.5")
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    requests = mine(sandbox_requests(url), run_id, "/payments/charges")
    started = next(s for s in await api.steps(run_id) if s.kind == "tool_started")
    assert {r["idempotency_key"] for r in requests} == {f"{run_id}:{started.seq}"}  # one key
    assert 409 in [r["status"] for r in requests] and requests[-1]["status"] == 200
    assert len(mine(sandbox_effects(url, "payments"), run_id)) == 1
    result = next(s for s in await api.steps(run_id) if s.kind == "tool_result")
    assert result.payload["status"] == "ok" and result.payload["output"]["customer"] == "cus_lin"


async def test_a_charge_found_unsettled_after_its_key_expired_waits_for_a_person(
    stack, executor_factory, sandbox_providers, tmp_path
):
    """The payments provider forgets keys; a key older than that protects nothing."""
    cp, api = stack
    url = sandbox_providers.url
    catalogue = json.loads(DEFAULT_PATH.read_text())
    catalogue["providers"]["payments"]["key_retention_hours"] = 1 / 3600  # one second
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(catalogue))
    run_id = await api.start("charger", "kai")
    (doomed,) = executor_factory(
        cp, AGENTRUN_CATALOGUE=path, AGENTRUN_FAULTS="executor.tool.after_response=kill@1"
    )
    await eventually(lambda: not doomed.alive, timeout=30, message="the kill never fired")
    # The takeover comes only after the 3 s lease lapsed: the key is older than 1 s.
    executor_factory(cp, AGENTRUN_CATALOGUE=path)
    unknown = await eventually(lambda: api.awaiting_person(run_id), timeout=30)
    assert "keeps keys" in unknown.payload["resolution"]
    assert len(mine(sandbox_requests(url), run_id, "/payments/charges")) == 1  # not sent again
    assert len(mine(sandbox_effects(url, "payments"), run_id)) == 1
    await api.resolve_unknown(run_id, unknown.seq, "happened", note="ch_ is in the dashboard")
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert len(mine(sandbox_effects(url, "payments"), run_id)) == 1


@pytest.mark.parametrize(
    ("fault", "sent", "found_by_lookup"),
    [
        ({"mode": "drop_response", "delay_ms": 0}, 1, True),  # it happened: found, not resent
        ({"mode": "error", "status": 502}, 2, False),  # it did not: resent, same key
    ],
)
async def test_an_email_in_doubt_is_looked_up_and_sent_again_only_if_it_did_not_happen(
    stack, executor_factory, sandbox_providers, fault, sent, found_by_lookup
):
    cp, api = stack
    url = sandbox_providers.url
    run_id = await api.start("writer")
    set_fault(url, provider="mail", path="/mail/send", key_prefix=f"{run_id}:", count=1, **fault)
    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    steps = await api.steps(run_id)
    started = next(
        s for s in steps if s.kind == "tool_started" and s.payload["tool"] == "send_email"
    )
    key = started.payload["idempotency_key"]
    sends = mine(sandbox_requests(url), run_id, "/mail/send")
    assert [r["idempotency_key"] for r in sends] == [key] * sent
    # The lookup key and the chain marker (a run no mail started: the mail is hop 1).
    marked = {"X-Agentrun-Key": key, "X-Agentrun-Origin": "agentrun", "X-Agentrun-Chain-Depth": "1"}
    assert all(r["body"]["headers"] == marked for r in sends)
    assert len(mine(sandbox_requests(url), run_id, "/mail/search")) == 1
    (message,) = mine(sandbox_effects(url, "mail"), run_id)
    assert message["stamp"] == key
    result = next(s for s in steps if s.kind == "tool_result" and s.ref_seq == started.seq)
    assert result.payload["status"] == "ok"
    assert ("lookup" in (result.payload.get("resolution") or "")) is found_by_lookup
