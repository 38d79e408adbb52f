"""The web console over plain HTTP: headers, sign-in, CSRF, and the access rules of gRPC.

A real control plane (in the test's event loop) with its HTTP ingress and the sandbox IdP; httpx
plays the browser (cookies, forms). The real-browser tests are in
test_console_browser.py.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from agentrun.v1 import approval_pb2, run_pb2, trigger_pb2
from control_plane.ground.config import ServerConfig
from control_plane.server import start as start_server
from tests.harness import auth
from tests.harness.agentrun_api import Api, sent_mail
from tests.harness.idp import add_member
from tests.harness.triggers import TriggerApi, post, signed
from tests.harness.waiting import eventually

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass(frozen=True)
class Replica:
    """A control plane in the test's event loop (starts fast; nothing here needs a process)."""

    address: str
    http_url: str


@pytest.fixture
async def stack(db_url, sandbox_idp):
    config = ServerConfig(database_url=db_url, listen="127.0.0.1:0", oidc_issuer=sandbox_idp.url)
    running = await start_server(config)
    cp = Replica(f"127.0.0.1:{running.port}", f"http://127.0.0.1:{running.http_port}")
    api = await Api.connect(cp.address, db_url)
    await api.publish("mailer", "approval", ["send_email"])
    yield cp, api
    await api.close()
    await running.stop(grace=0)


def csrf_of(page: httpx.Response) -> str:
    found = CSRF.search(page.text)
    assert found, page.text
    return found[1]


@asynccontextmanager
async def signed_in(base_url: str, key: str) -> AsyncIterator[httpx.AsyncClient]:
    """A cookie-keeping client signed in to the console with `key`."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        form = await client.get("/console/signin")
        resp = await client.post(
            "/console/signin/key", data={"csrf": csrf_of(form), "key": key, "next": "/console/runs"}
        )
        assert resp.status_code == 303 and resp.headers["location"] == "/console/runs", resp.text
        yield client


FLOW_FIELDS = ("client_id", "redirect_uri", "state", "nonce", "code_challenge")


async def sso(client: httpx.AsyncClient, idp_url: str, email: str) -> httpx.Response:
    """Sign `client` in as `email` through the code flow, by hand; the callback's answer."""
    form = await client.get("/console/signin")
    go = await client.post("/console/signin/oidc", data={"csrf": csrf_of(form), "workspace": "ws"})
    params = {k: v[0] for k, v in parse_qs(urlsplit(go.headers["location"]).query).items()}
    async with httpx.AsyncClient(base_url=idp_url) as idp:
        back = await idp.post(
            "/authorize", data={**{k: params[k] for k in FLOW_FIELDS}, "email": email}
        )
    return await client.get(back.headers["location"])


async def test_pages_send_a_strict_csp_and_load_nothing_from_elsewhere(stack, db_url):
    cp, api = stack
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops")
    async with httpx.AsyncClient(base_url=cp.http_url) as anon:
        signin = await anon.get("/console/signin")
    async with signed_in(cp.http_url, key) as client:
        runs = await client.get("/console/runs")
    for page in (signin, runs):
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert page.headers["x-frame-options"] == "DENY"
        assert "<script>" not in page.text and " style=" not in page.text  # nothing inline
        assert not re.search(r"(src|href)=\"https?://", page.text)  # no third-party loads


async def test_the_session_cookie_is_httponly_and_strict_and_the_key_is_never_shown(stack, db_url):
    cp, _ = stack
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops")
    async with httpx.AsyncClient(base_url=cp.http_url) as client:
        form = await client.get("/console/signin")
        resp = await client.post("/console/signin/key", data={"csrf": csrf_of(form), "key": key})
        assert resp.status_code == 303
        cookie = next(
            v
            for k, v in resp.headers.multi_items()
            if k == "set-cookie" and v.startswith("agentrun_console=")
        )
        attributes = cookie.lower()
        assert "httponly" in attributes and "samesite=strict" in attributes
        assert "path=/console" in attributes and key not in cookie
        runs = await client.get("/console/runs")
        assert runs.status_code == 200 and "key:ops" in runs.text and key not in runs.text


async def test_without_a_session_pages_redirect_to_sign_in_and_posts_are_refused(stack):
    cp, api = stack
    run_id = await api.start("mailer")
    async with httpx.AsyncClient(base_url=cp.http_url) as client:
        resp = await client.get(f"/console/runs/{run_id}")
        assert resp.status_code == 303
        target = urlsplit(resp.headers["location"])
        assert target.path == "/console/signin"
        assert parse_qs(target.query)["next"] == [f"/console/runs/{run_id}"]
        events = await client.get(f"/console/runs/{run_id}/events")
        assert events.status_code == 303  # the live feed too
        post = await client.post(f"/console/runs/{run_id}/unknowns/3", data={"decision": "retry"})
        assert post.status_code == 401
    async with httpx.AsyncClient(base_url=cp.http_url, cookies={"agentrun_console": "x"}) as c:
        assert (await c.get("/console/runs")).status_code == 303  # a made-up session


async def test_a_form_post_without_its_csrf_token_is_refused(stack, db_url):
    cp, _ = stack
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops")
    async with httpx.AsyncClient(base_url=cp.http_url) as client:
        # Sign-in forms carry a token too (no login CSRF).
        await client.get("/console/signin")
        refused = await client.post("/console/signin/key", data={"key": key})
        assert refused.status_code == 403 and "agentrun_console" not in client.cookies
        # A token in any characters is just a wrong token (compare_digest takes ASCII only).
        for form in ({"csrf": "é" * 64, "key": key}, {"csrf": "\u2028", "workspace": "ws"}):
            for path in ("/console/signin/key", "/console/signin/oidc"):
                refused = await client.post(path, data=form)
                assert refused.status_code == 403 and "CSRF" in refused.text, (path, form)
    async with signed_in(cp.http_url, key) as client:
        page = await client.get("/console/runs")
        for data in ({}, {"csrf": "0" * 64}, {"csrf": csrf_of(page) + "0"}, {"csrf": "ü" * 64}):
            resp = await client.post("/console/signout", data=data)
            assert resp.status_code == 403, data
            assert "CSRF" in resp.text
        assert (await client.get("/console/runs")).status_code == 200  # still signed in
        resp = await client.post("/console/signout", data={"csrf": csrf_of(page)})
        assert resp.status_code == 303
        assert (await client.get("/console/runs")).status_code == 303  # the session is gone


async def test_another_workspaces_run_is_not_found(stack, db_url):
    cp, api = stack
    other = await Api.connect(cp.address, db_url, workspace="other")
    await other.publish("mailer", "approval", ["send_email"])
    theirs = await other.start("mailer", "their secret input")
    await other.close()
    mine = await api.start("mailer", "my input")
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:
        assert (await client.get(f"/console/runs/{mine}")).status_code == 200
        resp = await client.get(f"/console/runs/{theirs}")
        assert resp.status_code == 404 and "their secret input" not in resp.text
        assert (await client.get(f"/console/runs/{theirs}/events")).status_code == 404
        listed = await client.get("/console/runs", params={"q": "secret"})
        assert theirs not in listed.text and "No runs match" in listed.text


async def test_the_runs_list_filters_and_names_a_bad_filter(stack, db_url):
    cp, api = stack
    await api.publish("poster", "poster", ["chat_post"])
    ada = await api.start("mailer", "email ada about the invoice")
    bob = await api.start("poster", "post for bob")
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:

        async def listed(**params) -> set[str]:
            resp = await client.get("/console/runs", params=params)
            assert resp.status_code == 200, resp.text
            return {r for r in (ada, bob) if r in resp.text}

        assert await listed() == {ada, bob}
        assert await listed(agent="poster") == {bob}
        assert await listed(q="INVOICE") == {ada}
        assert await listed(q=bob) == {bob}
        assert await listed(status="queued") == {ada, bob}
        assert await listed(status="completed") == set()
        assert await listed(wait_reason="approval") == set()
        assert await listed(trigger="nightly") == set()
        assert await listed(**{"from": "2000-01-01T00:00", "to": "2999-01-01T00:00"}) == {ada, bob}
        assert await listed(**{"to": "2000-01-01T00:00"}) == set()
        for bad, field in (
            ({"status": "done"}, "status"),
            ({"from": "yesterday"}, "from"),
            ({"agent": "Not A Slug"}, "agent"),
            ({"q": "inv\x00oice"}, "q"),
        ):
            resp = await client.get("/console/runs", params=bad)
            assert resp.status_code == 400 and field in resp.text, resp.text


async def test_a_reader_sees_approvals_but_cannot_decide(stack, db_url):
    cp, _ = stack
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:
        page = await client.get("/console/approvals")
        assert page.status_code == 200
        resp = await client.post(
            "/console/approvals/00000000-0000-4000-8000-000000000000",
            data={"csrf": csrf_of(page), "action": "approve"},
        )
        assert resp.status_code == 403 and "may not decide" in resp.text


async def test_a_person_signs_in_through_the_code_flow(stack, db, sandbox_idp):
    """The authorization-code flow with PKCE, state and nonce, followed by hand."""
    cp, _ = stack
    await add_member(db, "ws", "ada@example.com", "operator")
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=10) as client:
        form = await client.get("/console/signin")
        go = await client.post(
            "/console/signin/oidc", data={"csrf": csrf_of(form), "workspace": "ws"}
        )
        assert go.status_code == 303
        authorize = urlsplit(go.headers["location"])
        params = {k: v[0] for k, v in parse_qs(authorize.query).items()}
        assert f"{authorize.scheme}://{authorize.netloc}" == sandbox_idp.url
        assert params["code_challenge_method"] == "S256" and params["state"] and params["nonce"]
        assert params["redirect_uri"] == f"{cp.http_url}/console/callback"
        fields = {k: params[k] for k in FLOW_FIELDS}
        async with httpx.AsyncClient(base_url=sandbox_idp.url) as idp:
            back = await idp.post("/authorize", data={**fields, "email": "ada@example.com"})
        callback = back.headers["location"]
        # A callback whose state is not this browser's flow signs nobody in.
        for forged in ("forged", "%C3%A9t%C3%A9"):  # any characters: a wrong state, not a 500
            wrong = callback.replace(f"state={params['state']}", f"state={forged}")
            refused = await client.get(wrong)
            assert refused.status_code == 401 and "agentrun_console" not in client.cookies
        # The refused attempt never exchanged the code: it still signs this browser in.
        done = await client.get(callback)
        assert done.status_code == 200, done.text
        runs = await client.get("/console/runs")
        assert runs.status_code == 200 and "person:ada@example.com" in runs.text
        # A code is good once.
        assert (await client.get(callback)).status_code == 401


async def test_a_person_who_is_not_a_member_is_not_signed_in(stack, sandbox_idp):
    cp, _ = stack
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=10) as client:
        resp = await sso(client, sandbox_idp.url, "eve@example.com")
        assert resp.status_code == 403 and "not a member" in resp.text
        assert (await client.get("/console/runs")).status_code == 303


async def test_the_queue_page_shows_caps_running_and_queued_counts(stack, db_url):
    cp, api = stack
    await api.publish("poster", "poster", ["chat_post"])
    for _ in range(2):
        await api.start("mailer")
    await api.start("poster")
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:
        page = await client.get("/console/queue")
    assert page.status_code == 200
    assert re.search(r"<b>0</b> of at most 20", page.text)  # nobody runs: no executor
    rows = {
        m[1]: [int(n) for n in m.groups()[1:]]
        for m in re.finditer(
            r"<td><a href=\"/console/runs\?agent=(\w+)\">\w+</a></td><td>(\d+)</td><td>[^<]*</td>"
            r"<td>(\d+)</td><td>(\d+)</td>",
            page.text,
        )
    }
    assert rows == {"mailer": [0, 2, 2], "poster": [0, 1, 1]}  # running, queued, due


async def test_the_triggers_page_shows_filtered_events_with_their_reason(stack, db_url):
    cp, _ = stack
    hooks = await TriggerApi.connect(cp.address, db_url)
    await hooks.publish("triage")
    only_paid = trigger_pb2.FilterRule(
        field="type", op=trigger_pb2.FILTER_OP_EQUALS, value="invoice.paid"
    )
    secret = await hooks.webhook("stripe", "triage", "stripe", filters=[only_paid])
    await hooks.close()
    async with httpx.AsyncClient(base_url=cp.http_url) as http:
        for doc in ({"id": "evt_1", "type": "invoice.paid"}, {"id": "evt_2", "type": "x.failed"}):
            body, headers = signed("stripe", secret, doc, "")
            assert (await post(http, "ws", "stripe", body, headers)).status_code in (200, 202)
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:
        page = await client.get("/console/triggers", params={"status": "filtered"})
        assert page.status_code == 200
        assert "evt_2" in page.text and "filters[0]: type equals invoice.paid" in page.text
        assert "evt_1" not in page.text
        everything = await client.get("/console/triggers")
        run_id = re.search(r'href="/console/runs/([0-9a-f-]{36})"', everything.text)[1]
        assert "evt_1" in everything.text
        started = await client.get("/console/runs", params={"trigger": "stripe"})
        assert run_id in started.text
        other = await client.get("/console/runs", params={"trigger": "nightly"})
        assert run_id not in other.text


async def test_a_session_ends_with_its_key_or_its_membership(stack, db, db_url, sandbox_idp):
    cp, _ = stack
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="leaver")
    async with signed_in(cp.http_url, key) as client:
        assert (await client.get("/console/runs")).status_code == 200
        await db.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE principal = 'leaver' AND revoked_at IS NULL"
        )

        async def signed_out() -> bool:  # the resolver caches a verified key for 2 s
            return (await client.get("/console/runs")).status_code == 303

        await eventually(
            signed_out, timeout=10, interval=0.2, message="the session outlived its key"
        )
    await add_member(db, "ws", "bob@example.com", "reader")
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=10) as client:
        await sso(client, sandbox_idp.url, "bob@example.com")
        assert (await client.get("/console/runs")).status_code == 200
        await db.execute("DELETE FROM workspace_members WHERE person = 'bob@example.com'")
        assert (await client.get("/console/runs")).status_code == 303


async def test_an_approver_rejects_with_a_reason_and_the_model_reads_it(
    stack, db_url, executor_factory, sandbox_providers
):
    cp, api = stack
    approver = "manager@example.com"
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[approver])
    await api.publish("held", "approval", ["send_email"], approval=policy)
    run_id = await api.start("held", "email ada")
    executor_factory(cp.address, AGENTRUN_EXECUTOR_KEY=await auth.executor_key(db_url))
    key = await auth.workspace_key(db_url, "ws", role="approver", principal=approver)
    async with signed_in(cp.http_url, key) as client:

        async def pending() -> str | None:
            page = await client.get("/console/approvals")
            found = re.search(r'href="/console/approvals/([0-9a-f-]{36})"', page.text)
            return found[1] if found else None

        approval_id = await eventually(pending, timeout=30, message="nothing waited for approval")
        url = f"/console/approvals/{approval_id}"
        page = await client.get(url)
        assert "ada@example.com" in page.text and 'id="reject"' in page.text
        csrf = csrf_of(page)
        blank = await client.post(url, data={"csrf": csrf, "action": "reject", "reason": " "})
        assert blank.status_code == 400 and "reason" in blank.text
        done = await client.post(
            url, data={"csrf": csrf, "action": "reject", "reason": "wrong price"}
        )
        assert done.status_code == 303
        again = await client.post(url, data={"csrf": csrf, "action": "approve"})
        assert again.status_code == 409 and f"already rejected by {approver}" in again.text
    (run,) = await api.wait_terminal([run_id])
    assert run.output == "The email tool said: rejected: wrong price"
    assert sent_mail(sandbox_providers.url, run_id) == []


async def test_the_live_feed_sends_the_run_its_steps_and_the_end_resuming_after_the_last_seen(
    stack, db_url
):
    cp, api = stack
    run_id = await api.start("mailer", "email ada")
    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id="ws", run_id=run_id))
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:

        async def events(**headers: str | bytes) -> list[tuple[str, str]]:
            url = f"/console/runs/{run_id}/events"
            async with client.stream("GET", url, headers=headers) as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                body = (await resp.aread()).decode()
            found = re.findall(r"event: (\w+)\n(?:id: (\d+)\n)?", body)
            return [(name, seq) for name, seq in found]

        assert await events() == [("run", ""), ("step", "0"), ("step", "1"), ("end", "")]
        assert await events(**{"Last-Event-ID": "0"}) == [("run", ""), ("step", "1"), ("end", "")]
        # Past any seq a step can have: nothing more (it was a broken stream, the int4
        # overflowing in the step query). Not a number (a superscript two): from the start.
        for past in ("2147483647", "99999999999999999999"):
            assert await events(**{"Last-Event-ID": past}) == [("run", ""), ("end", "")]
        everything = [("run", ""), ("step", "0"), ("step", "1"), ("end", "")]
        assert await events(**{"Last-Event-ID": b"\xb2"}) == everything


async def test_only_a_live_workspace_key_signs_in(stack, db_url):
    cp, _ = stack
    refusals = [
        (await auth.executor_key(db_url), 403, "workspace API key"),
        (await auth.platform_key(db_url), 403, "workspace API key"),
        ("agr_ws_0123456789abcdef_" + "x" * 43, 401, "unknown, revoked or expired"),
        ("not a key", 401, "not an agentrun key"),
    ]
    async with httpx.AsyncClient(base_url=cp.http_url) as client:
        for key, status, words in refusals:
            form = await client.get("/console/signin")
            resp = await client.post(
                "/console/signin/key", data={"csrf": csrf_of(form), "key": key}
            )
            assert resp.status_code == status and words in resp.text, resp.text
            assert key not in resp.text and "agentrun_console" not in client.cookies


async def test_run_actions_need_their_role_a_csrf_token_and_a_run_that_can_take_them(stack, db_url):
    cp, api = stack  # no executor: the runs stay queued
    run_id = await api.start("mailer", "email ada")
    reader = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, reader) as client:
        confirm = await client.get(f"/console/runs/{run_id}/actions/cancel")
        assert confirm.status_code == 200 and "ends as cancelled now" in confirm.text
        assert "does not hold it" in confirm.text  # says so before anyone presses
        resp = await client.post(
            f"/console/runs/{run_id}/actions/cancel", data={"csrf": csrf_of(confirm)}
        )
        assert resp.status_code == 403 and "may not operate" in resp.text
    assert (await api.get(run_id)).status == run_pb2.RUN_STATUS_QUEUED
    operator = await auth.workspace_key(db_url, "ws", role="operator", principal="ops")
    async with signed_in(cp.http_url, operator) as client:
        action = f"/console/runs/{run_id}/actions"
        assert (await client.get(f"{action}/explode")).status_code == 404
        resp = await client.post(f"{action}/cancel", data={})
        assert resp.status_code == 403 and "CSRF" in resp.text
        page = await client.get(f"{action}/fork")
        csrf = csrf_of(page)
        for data, field in (
            ({"from_seq": "x"}, "from_seq"),
            ({"from_seq": "0", "agent_version": "v2"}, "agent_version"),
        ):
            resp = await client.post(f"{action}/fork", data={"csrf": csrf, **data})
            assert resp.status_code == 400 and field in resp.text, resp.text
        resp = await client.post(f"{action}/move", data={"csrf": csrf})
        assert resp.status_code == 403 and "may not platform" in resp.text  # a platform action
        resp = await client.post(f"{action}/cancel", data={"csrf": csrf, "reason": "typo"})
        assert resp.status_code == 303 and resp.headers["location"] == f"/console/runs/{run_id}"
        run = await api.get(run_id)
        assert run.status == run_pb2.RUN_STATUS_CANCELLED and "typo" in run.error
        again = await client.post(f"{action}/cancel", data={"csrf": csrf})
        assert again.status_code == 409 and "already ended" in again.text


async def test_the_runs_list_pages_by_cursor_and_names_a_bad_page(stack, db_url):
    cp, api = stack
    started = [await api.start("mailer", f"run {i}") for i in range(5)]
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:
        seen: list[str] = []
        path = "/console/runs?size=2"
        while path:
            page = await client.get(path)
            assert page.status_code == 200
            seen += [r for r in re.findall(r'data-run="([^"]+)"', page.text)]
            found = re.search(r'id="next" href="([^"]+)"', page.text)
            path = found[1].replace("&amp;", "&") if found else ""
        assert seen == started[::-1]
        live = await client.get("/console/runs/live?size=2")
        assert live.status_code == 200 and started[-1] in live.json()["rows"]
        assert 'data-count="queued">5<' in live.json()["counts"]
        for bad, field in (({"size": "0"}, "size"), ({"before": "x~y"}, "before")):
            resp = await client.get("/console/runs", params=bad)
            assert resp.status_code == 400 and field in resp.text, resp.text


async def test_bulk_cancel_cancels_the_unfinished_runs_the_filtered_list_shows(stack, db_url):
    cp, api = stack
    await api.publish("poster", "poster", ["chat_post"])
    mail = [await api.start("mailer", f"mail {i}") for i in range(3)]
    post = await api.start("poster", "post it")
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops")
    async with signed_in(cp.http_url, key) as client:
        confirm = await client.get("/console/runs/bulk/cancel", params={"agent": "mailer"})
        assert confirm.status_code == 200
        assert re.search(r'id="bulk-count">3<', confirm.text) and post not in confirm.text
        assert "<b>agent</b> = mailer" in confirm.text
        data = {"csrf": csrf_of(confirm), "agent": "mailer", "reason": "wrong list"}
        resp = await client.post("/console/runs/bulk/cancel", data=data)
        assert resp.status_code == 303 and "cancelled=3" in resp.headers["location"]
        none_left = await client.get("/console/runs/bulk/cancel", params={"agent": "mailer"})
        assert "nothing will be cancelled" in none_left.text
    for run_id in mail:
        run = await api.get(run_id)
        assert run.status == run_pb2.RUN_STATUS_CANCELLED and "wrong list" in run.error
    assert (await api.get(post)).status == run_pb2.RUN_STATUS_QUEUED


async def test_a_signal_from_the_page_reaches_the_runs_mailbox_once(stack, db, db_url):
    cp, api = stack
    run_id = await api.start("mailer", "wait for me")
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops")
    async with signed_in(cp.http_url, key) as client:
        page = await client.get(f"/console/runs/{run_id}/actions/signal")
        assert "mailbox" in page.text
        event = re.search(r'name="event_id" value="([^"]+)"', page.text)
        assert event
        form = {"csrf": csrf_of(page), "event_id": event[1], "payload_json": '{"ok": true}'}
        bad = await client.post(
            f"/console/runs/{run_id}/actions/signal", data={**form, "signal_name": "-no"}
        )
        assert bad.status_code == 400 and "signal_name" in bad.text
        for _ in range(2):  # a resend with the same event id is the same signal
            sent = await client.post(
                f"/console/runs/{run_id}/actions/signal", data={**form, "signal_name": "go"}
            )
            assert sent.status_code == 303
    rows = await db.fetch(
        "SELECT name, payload::text, sent_by FROM run_signals WHERE run_id = $1", uuid.UUID(run_id)
    )
    assert [tuple(r) for r in rows] == [("go", '{"ok": true}', "key:ops")]


async def test_the_run_page_says_a_run_is_paused_and_shows_its_tags(stack, db_url):
    cp, api = stack
    resp = await api.runs.StartRun(
        run_pb2.StartRunRequest(workspace_id=api.ws, agent_id="mailer", input="hi", tags=["eu"])
    )
    run_id = resp.run.run_id
    await api.runs.PauseRun(run_pb2.PauseRunRequest(workspace_id=api.ws, run_id=run_id))
    key = await auth.workspace_key(db_url, "ws", role="reader", principal="reader")
    async with signed_in(cp.http_url, key) as client:
        page = await client.get(f"/console/runs/{run_id}")
        assert 'id="run-paused"' in page.text and "Tags: eu" in page.text
        await api.runs.ResumeRun(run_pb2.ResumeRunRequest(workspace_id=api.ws, run_id=run_id))
        assert 'id="run-paused"' not in (await client.get(f"/console/runs/{run_id}")).text
