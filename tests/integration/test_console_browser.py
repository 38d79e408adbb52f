"""The web console in a real browser (Debian's chromium, driven by Playwright).

A real control plane, executors, Postgres, model and provider sandboxes, and
the sandbox IdP. A person signs in through the IdP's authorize page, finds a
run, watches its timeline advance without reloading, decides the held call
from the inbox and sees the run complete; an edit reaches the provider as
edited; an operator who pasted a key settles an unknown outcome. Every page
visited is saved to test-artifacts/console/; a console error (a CSP violation
included) fails the test.
"""

from __future__ import annotations

import json
import re

import pytest

from agentrun.v1 import approval_pb2, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, clear_faults, sandbox_effects, sent_mail, set_fault
from tests.harness.browser import chromium, require_chromium
from tests.harness.idp import add_member
from tests.harness.waiting import eventually

APPROVER = "manager@example.com"
LOST = {"mode": "drop_response", "delay_ms": 0}


@pytest.fixture
async def stack(db_url, db, control_plane, sandbox_model, sandbox_providers, sandbox_idp):
    require_chromium()
    cp = control_plane(db_url, AGENTRUN_OIDC_ISSUER=sandbox_idp.url)
    api = await Api.connect(cp.address, db_url)
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[APPROVER])
    await api.publish("mailer", "approval", ["send_email"], approval=policy)
    await add_member(db, "ws", APPROVER, "approver")
    yield cp, api
    await api.close()


async def test_sign_in_watch_a_run_live_approve_it_from_the_inbox_and_see_it_complete(
    stack, executor_factory, sandbox_providers
):
    cp, api = stack
    run_id = await api.start("mailer", "email ada")
    async with chromium(cp.http_url) as b:
        await b.goto("/console/signin")
        await b.snap("signin")
        await b.sign_in_with_sso("ws", APPROVER)
        page = b.page
        await page.fill("#run-filters input[name=q]", run_id)
        await page.click("#run-filters button")
        assert await page.locator("#runs tbody tr").count() == 1
        await b.snap("runs")
        await page.click(f"#runs a[href='/console/runs/{run_id}']")
        await page.wait_for_selector("#step-0")
        assert await page.locator("li.step").count() == 1  # only the input: nobody ran it yet
        await page.evaluate("window.notReloaded = true")

        executor_factory(cp)  # the timeline advances on the open page, from the live feed
        await page.wait_for_selector("li.step.approval_requested")
        assert await page.locator("li.step.model_decision .what").first.inner_text() == (
            "call send_email"
        )
        assert await page.text_content("#run-wait") == "approval"
        assert await page.evaluate("window.notReloaded") is True
        await b.snap("run-waiting-for-approval")

        await page.click("nav >> text=Approvals")
        await page.wait_for_selector("#approvals .approval-link")
        await b.snap("approvals-inbox")
        await page.click("#approvals .approval-link")
        arguments = json.loads(await page.inner_text("#arguments"))
        assert (
            arguments["to"] == "ada@example.com" and sent_mail(sandbox_providers.url, run_id) == []
        )
        await b.snap("approval")
        await page.click("#approve button")
        decision = await page.inner_text("#decision")
        assert decision.startswith(f"approved by {APPROVER}")

        await page.click(f"a[href='/console/runs/{run_id}']")
        await page.wait_for_selector("#run-status:text('completed')", timeout=30_000)
        await page.wait_for_selector("li.step.finish")
        await b.snap("run-completed")
        assert b.errors == []
    (mail,) = sent_mail(sandbox_providers.url, run_id)
    assert {k: mail["body"][k] for k in arguments} == arguments
    assert (await api.get(run_id)).status == run_pb2.RUN_STATUS_COMPLETED


async def test_an_edit_is_shown_as_a_diff_and_reaches_the_provider_as_edited(
    stack, executor_factory, sandbox_providers
):
    cp, api = stack
    run_id = await api.start("mailer", "email ada")
    executor_factory(cp)
    async with chromium(cp.http_url) as b:
        await b.sign_in_with_sso("ws", APPROVER)
        page = b.page

        async def listed() -> bool:
            await b.goto("/console/approvals")
            return await page.locator("#approvals .approval-link").count() == 1

        await eventually(listed, timeout=30, message="the run never asked for an approval")
        await page.click("#approvals .approval-link")
        original = json.loads(await page.inner_text("#arguments"))
        edited = {**original, "body": "Hi Ada, the 2026 price is 90."}
        await page.fill("#edit textarea[name=arguments]", json.dumps(edited))
        await page.fill("#edit input[name=note]", "fix the price")
        await page.click("#edit button")
        added = await page.locator("#review-diff .dadd").all_inner_texts()
        removed = await page.locator("#review-diff .ddel").all_inner_texts()
        assert added == ['+   "body": "Hi Ada, the 2026 price is 90.",']
        assert len(removed) == 1 and removed[0].startswith('-   "body": ')
        assert sent_mail(sandbox_providers.url, run_id) == []  # a review decides nothing
        await b.snap("approval-edit-review")
        await page.click("#confirm-edit button")
        assert (await page.inner_text("#decision")).startswith(f"edited by {APPROVER}")
        assert "the 2026 price is 90" in await page.inner_text("#decided-diff")
        await b.snap("approval-edited")
        assert b.errors == []
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    (mail,) = sent_mail(sandbox_providers.url, run_id)
    assert mail["body"]["body"] == "Hi Ada, the 2026 price is 90."
    assert "fix the price" in run.output


async def test_an_operator_settles_an_unknown_outcome_from_the_page(
    stack, db_url, executor_factory, sandbox_providers
):
    cp, api = stack
    url = sandbox_providers.url
    await api.publish("poster", "poster", ["chat_post"])
    run_id = await api.start("poster")
    set_fault(url, provider="chat", key_prefix=f"{run_id}:", count=1, **LOST)
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops-alice")
    try:
        executor_factory(cp)
        unknown = await eventually(
            lambda: api.awaiting_person(run_id),
            timeout=30,
            message="the run never waited for a person",
        )
        async with chromium(cp.http_url) as b:
            await b.sign_in_with_key(key)
            page = b.page
            await b.goto("/console/unknowns")
            form = page.locator(f"form[action='/console/runs/{run_id}/unknowns/{unknown.seq}']")
            await b.snap("unknown-outcomes")
            await form.locator("select[name=decision]").select_option("happened")
            await form.locator("input[name=note]").fill("the post is in the channel")
            await form.locator("button").click()
            await page.wait_for_url(re.compile(f".*/console/runs/{run_id}$"))
            await page.wait_for_selector("#run-status:text('completed')", timeout=30_000)
            decided = page.locator(f"li.step[data-resolves='{unknown.seq}']")
            assert "happened by key:ops-alice" in await decided.inner_text()
            assert await page.locator(f"#resolve-{unknown.seq}").count() == 0
            await b.snap("run-unknown-settled")
            for name in ("queue", "triggers"):
                await b.goto(f"/console/{name}")
                await b.snap(name)
            assert b.errors == []
    finally:
        clear_faults(url)
    posts = [e for e in sandbox_effects(url, "chat") if (e["key"] or "").startswith(run_id)]
    assert len(posts) == 1  # decided, not retried
    assert (await api.get(run_id)).status == run_pb2.RUN_STATUS_COMPLETED
