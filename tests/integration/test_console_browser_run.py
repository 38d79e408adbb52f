"""A run's page in a real browser (Debian's chromium via Playwright): its profile and actions.

A real control plane and executor run the sandbox model's `echo_input` agent (a model
call, an `echo` tool call, a second model call) to completion. The page's waterfall shows
each model and tool call with the time the step log gives it, and the tokens and cost the
run was charged. From the page an operator forks the run after its tool result, retries it
from the start and cancels a run waiting for an approval, each after a confirmation that
says what will happen. At a phone's width the page is no wider than the screen.
"""

from __future__ import annotations

import re
import uuid

import asyncpg
import pytest

from agentrun.v1 import approval_pb2, run_pb2, session_pb2, session_pb2_grpc
from control_plane.store import runs as run_store
from control_plane.store import steps as step_store
from tests.harness import auth
from tests.harness.agentrun_api import echo_stack
from tests.harness.browser import chromium, require_chromium
from tests.harness.waiting import eventually

PHONE = {"width": 390, "height": 844}


@pytest.fixture
async def stack(db_url, control_plane, executor_factory):
    require_chromium()
    async with echo_stack(control_plane, db_url) as (cp, api):
        policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=["boss@example.com"])
        await api.publish("mailer", "approval", ["send_email"], approval=policy)
        executor_factory(cp)
        pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
        key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops-kim")
        try:
            yield cp, api, pool, key
        finally:
            await pool.close()


def ms(a, b) -> int:  # noqa: ANN001
    return round((b - a).total_seconds() * 1000)


async def test_the_waterfall_durations_match_the_step_log_and_the_totals_the_run(stack):
    cp, api, pool, key = stack
    run_id = await api.start("echoer", "hello profile")
    (done,) = await api.wait_terminal([run_id])
    assert done.status == run_pb2.RUN_STATUS_COMPLETED, done.error
    steps = await step_store.list_steps(pool, "ws", uuid.UUID(run_id), 0, 100)
    at = {s.seq: s.created_at for s in steps}
    row = await run_store.get_run(pool, "ws", uuid.UUID(run_id))
    assert row is not None
    async with chromium(cp.http_url) as b:
        await b.sign_in_with_key(key)
        await b.goto(f"/console/runs/{run_id}")
        calls = await b.page.eval_on_selector_all(
            "#waterfall tr.call",
            "rows => rows.map(r => [r.classList.contains('model') ? 'model' : 'tool',"
            " +r.dataset.seq, +r.dataset.endSeq, +r.dataset.ms])",
        )
        kinds = [s.kind for s in steps]
        assert [c[0] for c in calls].count("model") == kinds.count("model_decision") >= 2
        assert [c[0] for c in calls].count("tool") == kinds.count("tool_started") >= 1
        for kind, seq, end_seq, took in calls:
            assert took == ms(at[seq], at[end_seq]), (kind, seq, end_seq)
            ended = next(s for s in steps if s.seq == end_seq)
            assert ended.kind == ("model_decision" if kind == "model" else "tool_result")
        tokens = await b.page.text_content("#total-tokens")
        assert tokens == f"{row.input_tokens} · {row.output_tokens}" and row.input_tokens > 0
        assert await b.page.text_content("#span") is not None
        await b.page.locator("#timeline details.payload").first.click()  # payloads expand
        await b.snap("run-profile")

        await b.page.set_viewport_size(PHONE)
        await b.goto(f"/console/runs/{run_id}")
        assert await b.page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        await b.snap("run-profile-phone")

        await b.page.set_viewport_size({"width": 1280, "height": 900})
        await b.goto("/console/charts?agent=echoer")  # drawn from the runs table
        totals = b.page.locator("#chart-totals")
        assert await totals.locator("[data-total=started]").text_content() == "1"
        assert await totals.locator("[data-total=completed]").text_content() == "1"
        assert await totals.locator("[data-total=tokens]").text_content() == str(
            row.input_tokens + row.output_tokens
        )
        done_bars = b.page.locator("rect[data-series=completed][data-value='1']")
        assert await done_bars.count() == 1
        await b.goto("/console/charts?window=48h")  # every agent, one row each
        echoer = b.page.locator("#by-agent tr[data-agent=echoer] .tokens")
        assert await echoer.text_content() == str(row.input_tokens + row.output_tokens)
        await b.snap("charts")
        assert b.errors == []


async def test_fork_retry_and_cancel_from_the_page_after_a_confirmation(stack):
    cp, api, pool, key = stack
    run_id = await api.start("echoer", "hello actions")
    await api.wait_terminal([run_id])
    result = next(s for s in await api.steps(run_id) if s.kind == "tool_result")
    async with chromium(cp.http_url) as b:
        await b.sign_in_with_key(key)
        page = b.page
        await b.goto(f"/console/runs/{run_id}")
        await page.fill("#action-fork input[name=from_seq]", str(result.seq))
        await page.click("#action-fork button")
        assert "copy of this run's steps" in await page.inner_text("#what-happens")
        await b.snap("action-fork-confirm")
        await page.click("#confirm-action button")
        await page.wait_for_selector("#forked-from")
        fork_id = page.url.rsplit("/", 1)[1]
        assert fork_id != run_id
        assert f"at step #{result.seq}" in await page.inner_text("#forked-from")
        fork = await run_store.get_run(pool, "ws", uuid.UUID(fork_id))
        assert fork is not None and str(fork.forked_from_run_id) == run_id
        assert fork.forked_from_seq == result.seq
        await page.wait_for_selector("#run-status:text('completed')", timeout=30_000)
        await b.snap("forked-run")

        await b.goto(f"/console/runs/{run_id}")
        await page.click("#action-retry")
        assert "every model and tool call is made again" in await page.inner_text("#what-happens")
        await page.click("#confirm-action button")
        await page.wait_for_selector("#forked-from")
        retry = await run_store.get_run(pool, "ws", uuid.UUID(page.url.rsplit("/", 1)[1]))
        assert retry is not None and retry.forked_from_seq == 0

        waiting = await api.start("mailer", "email ada")

        async def parked() -> bool:
            return (await api.get(waiting)).status == run_pb2.RUN_STATUS_WAITING

        await eventually(parked, timeout=30, message="the run never waited for its approval")
        await b.goto(f"/console/runs/{waiting}")
        await page.click("#action-cancel")
        assert "ends as cancelled now" in await page.inner_text("#what-happens")
        assert "Needs the operate role." in await page.inner_text("#needs")
        await b.snap("action-cancel-confirm")
        await page.fill("#confirm-action input[name=reason]", "wrong recipient")
        await page.click("#confirm-action button")
        await page.wait_for_url(re.compile(f".*/console/runs/{waiting}$"))
        assert await page.text_content("#run-status") == "cancelled"
        assert await page.locator("#action-cancel").count() == 0
        await b.snap("run-cancelled")
        assert b.errors == []
    assert (await api.get(waiting)).status == run_pb2.RUN_STATUS_CANCELLED


OBJECT_PAGES = ("sessions", "agents", "tools", "connections", "releases", "credits", "charts")


async def test_every_object_has_a_page_that_fits_a_phone(stack):
    cp, api, pool, key = stack
    stub = session_pb2_grpc.SessionServiceStub(api.channel)
    created = await stub.CreateSession(
        session_pb2.CreateSessionRequest(workspace_id="ws", agent_id="echoer", title="support")
    )
    session_id = created.session.session_id
    turn = await stub.SendMessage(
        session_pb2.SendMessageRequest(workspace_id="ws", session_id=session_id, text="hi there")
    )
    await api.wait_terminal([turn.turn.run_id])
    await api.publish("echoer", "echo_input", ["echo", "crm_lookup"])  # v2: one more tool
    async with chromium(cp.http_url) as b:
        await b.sign_in_with_key(key)
        page = b.page
        await page.set_viewport_size(PHONE)
        for name in OBJECT_PAGES:
            resp = await b.goto(f"/console/{name}")
            assert resp.status == 200, name
            assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            await b.snap(f"{name}-phone")
        await page.set_viewport_size({"width": 1280, "height": 900})

        await b.goto("/console/sessions")
        await page.click(f"#sessions a[href='/console/sessions/{session_id}']")
        first = page.locator("#turns li[data-turn='1']")
        assert "hi there" in await first.inner_text()
        assert await first.locator(".badge").text_content() == "completed"
        await b.snap("session")

        await b.goto("/console/agents/echoer")  # the newest two versions, diffed
        added = await page.locator("#spec-diff .dadd").all_inner_texts()
        assert any('"crm_lookup"' in line for line in added), added
        await b.snap("agent-diff")

        await b.goto("/console/tools")
        echo = page.locator("#tools tr[data-tool='echo']")
        assert await echo.count() == 1
        assert await echo.locator(".idempotency").text_content() != ""

        assert b.errors == []

        # Bad input is a page naming what is wrong (the browser logs the 4xx load itself).
        resp = await b.goto("/console/agents/echoer?a=99")
        assert resp.status == 404 and "no version 99" in await page.inner_text("main")
        resp = await b.goto("/console/runs?after=not-a-cursor")
        assert resp.status == 400 and "after" in await page.inner_text("main")
