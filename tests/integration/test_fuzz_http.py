"""Every HTTP route, asked hostile requests, answers below 500 and keeps serving.

The HTTP twin of test_fuzz_grpc.py. Routes come from the apps' route tables
(tests/harness/http_fuzz.py), so a new route is fuzzed without touching this file: the
control plane's ingress (the console signed in and not, webhooks, session messages,
approval links, connections, health and metrics) and the sandbox servers the product is
tested against (model, providers, IdP, MCP). Path values include real objects (a run, the
workspace's triggers, a session), so requests get past the lookups; webhooks also get
validly signed deliveries of hostile JSON, and sessions messages sent with a real key.
Promised: no 5xx, no traceback in the control plane's log, and still serving at the end.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from agentrun.v1 import session_pb2
from control_plane.ground.config import ServerConfig
from control_plane.server import RunningServer, start
from sandbox import idp, mcp_server, model_server, providers
from sandbox.serve import BackgroundServer
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.http_fuzz import HttpFuzzer, Request, routes
from tests.harness.logs import tracebacks
from tests.harness.triggers import SCHEME, TriggerApi, signed
from tests.integration.test_console_http import csrf_of

REQUESTS_PER_ROUTE = 40
SIGNED_PER_SCHEME = 60
SESSION_MESSAGES = 150
# What a client cannot even put on the wire (httpx refuses it before sending).
UNSENDABLE = (httpx.InvalidURL, httpx.LocalProtocolError, UnicodeEncodeError, ValueError)


@dataclass
class Objects:
    """Real things of workspace ws for path values, and the keys to reach them."""

    key: str
    run_id: str
    session_id: str
    hooks: dict[str, str]  # trigger id -> signature scheme, secret below
    secrets: dict[str, str]


@pytest.fixture
async def stack(db_url: str, sandbox_idp) -> AsyncIterator[tuple[RunningServer, Objects]]:
    config = ServerConfig(database_url=db_url, listen="127.0.0.1:0", oidc_issuer=sandbox_idp.url)
    running = await start(config)
    address = f"127.0.0.1:{running.port}"
    triggers = await TriggerApi.connect(address, db_url)
    api = await Api.connect(address, db_url)
    try:
        await triggers.publish("writer-agent")
        hooks, secrets = {}, {}
        for scheme in SCHEME:
            trigger_id = f"hook-{scheme.replace('_', '-')}"
            secrets[trigger_id] = await triggers.webhook(trigger_id, "writer-agent", scheme)
            hooks[trigger_id] = scheme
        session = await triggers.sessions.CreateSession(
            session_pb2.CreateSessionRequest(workspace_id="ws", agent_id="writer-agent")
        )
        await api.publish("mailer", "approval", ["send_email"])
        run_id = await api.start("mailer", "hello")
        key = triggers.key or ""
        yield running, Objects(key, run_id, session.session.session_id, hooks, secrets)
    finally:
        await triggers.close()
        await api.close()
        await running.stop(grace=0)


async def _send(client: httpx.AsyncClient, req: Request) -> httpx.Response | None:
    try:
        return await client.request(
            req.method, req.path, params=req.params, headers=req.headers, **req.body
        )
    except UNSENDABLE:
        return None


async def _console_tokens(client: httpx.AsyncClient, key: str, run_id: str) -> tuple[str, ...]:
    """Sign `client` in to the console; the CSRF tokens of its forms (sign-in and run page)."""
    csrf = csrf_of(await client.get("/console/signin"))
    signin = {"csrf": csrf, "key": key, "next": "/console/runs"}
    assert (await client.post("/console/signin/key", data=signin)).status_code == 303
    page = await client.get(f"/console/runs/{run_id}")
    assert page.status_code == 200, page.text[:300]
    return csrf, csrf_of(page)


async def test_every_ingress_route_answers_hostile_requests_below_500(stack, caplog) -> None:
    caplog.set_level(logging.INFO)
    running, objects = stack
    app = running.http.app if running.http else None
    assert isinstance(app, Starlette)
    table = list(routes(list(app.routes)))
    assert len(table) >= 25, table
    real = (objects.run_id, objects.session_id, *objects.hooks)
    fuzz, base = HttpFuzzer(7, real), f"http://127.0.0.1:{running.http_port}"
    codes: Counter[tuple[str, int]] = Counter()
    errors: list[str] = []
    async with (
        httpx.AsyncClient(base_url=base, timeout=30) as signed_in,
        httpx.AsyncClient(base_url=base, timeout=30) as anonymous,
    ):
        csrf = await _console_tokens(signed_in, objects.key, objects.run_id)
        for n, (template, methods) in enumerate(table * REQUESTS_PER_ROUTE):
            client = signed_in if n % 2 else anonymous
            req = fuzz.request(template, methods, csrf)
            if client is anonymous and n % 4 == 0:
                req.headers["Authorization"] = f"Bearer {objects.key}"
            if template.endswith(("/events", "/watch")):
                req.method = "HEAD"  # the live feed: its answer, not a stream held open
            resp = await _send(client, req)
            if resp is None:
                continue
            codes[(template, resp.status_code)] += 1
            if resp.status_code >= 500:
                errors.append(
                    f"{resp.status_code} {req.method} {req.path[:100]} -> {resp.text[:200]}"
                )
        assert (await anonymous.get("/healthz")).status_code == 200
    assert not errors, "\n".join(errors[:30])
    assert not tracebacks(caplog.records), "\n".join(tracebacks(caplog.records)[:10])
    for template, _ in table:  # each route was asked, not only refused by the router
        asked = sum(n for (t, _), n in codes.items() if t == template)
        assert asked >= REQUESTS_PER_ROUTE // 2, (template, asked)
    assert any(code == 200 for (t, code) in codes if t.startswith("/console/runs")), codes


async def test_signed_deliveries_and_keyed_messages_of_any_shape_are_answered_below_500(
    stack, caplog
) -> None:
    """Past the signature and the key: the handlers' own reading of hostile JSON."""
    caplog.set_level(logging.INFO)
    running, objects = stack
    fuzz = HttpFuzzer(11, nul=False)
    codes: Counter[tuple[str, int]] = Counter()
    base = f"http://127.0.0.1:{running.http_port}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for trigger_id, scheme in objects.hooks.items():
            for n in range(SIGNED_PER_SCHEME):
                doc = fuzz.json()
                if n % 2 and isinstance(doc, dict):  # with the delivery ids Stripe and Slack send
                    doc.update(id=f"evt_{n}", event_id=f"Ev{n}")
                body, headers = signed(
                    scheme, objects.secrets[trigger_id], doc, f"delivery-{trigger_id}-{n}"
                )
                resp = await client.post(f"/hooks/ws/{trigger_id}", content=body, headers=headers)
                codes[(scheme, resp.status_code)] += 1
        url = f"/v1/workspaces/ws/sessions/{objects.session_id}/messages"
        for _ in range(SESSION_MESSAGES):
            doc = fuzz.json()
            if isinstance(doc, dict) and fuzz.rng.random() < 0.7:  # a message, hostile around it
                doc["text"] = fuzz.text() or "hi"
                doc.pop("request_id", None)
            # As json.dumps writes it: a lone surrogate as its escape (httpx's json= cannot).
            headers = {**auth.bearer(objects.key), "Content-Type": "application/json"}
            resp = await client.post(url, content=json.dumps(doc).encode(), headers=headers)
            codes[("session", resp.status_code)] += 1
    assert not [k for k in codes if k[1] >= 500], codes
    assert not tracebacks(caplog.records), "\n".join(tracebacks(caplog.records)[:10])
    # The signatures were good: some deliveries were taken, so the documents reached the
    # trigger's own reading (filters, dedup, the run's input), not only the signature check.
    assert sum(n for (source, code), n in codes.items() if source != "session" and code < 300)


FACTORIES = {
    "model": model_server.create_app,
    "providers": providers.create_app,
    "idp": idp.create_app,
}
SANDBOXES = (*FACTORIES, "mcp")


def _sandbox(name: str) -> tuple[Any, list[tuple[str, set[str]]]]:
    """The sandbox app `name` and the routes to fuzz on it."""
    if name == "mcp":
        desk = mcp_server.create_app(token="desk-token")
        # MCP's own path: POST and DELETE (a GET opens the server's event stream, by design
        # held open).
        return desk, [*routes(desk.routes), (mcp_server.MCP_PATH, {"POST", "DELETE"})]
    app = FACTORIES[name]()
    return app, list(routes(list(app.routes)))


@pytest.mark.parametrize("name", SANDBOXES)
def test_every_sandbox_route_answers_hostile_requests_below_500(name: str) -> None:
    app, table = _sandbox(name)
    fuzz = HttpFuzzer(100 + SANDBOXES.index(name))
    errors: list[str] = []
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for template, methods in table * REQUESTS_PER_ROUTE:
            req = fuzz.request(template, methods, ())
            try:
                resp = client.request(
                    req.method, req.path, params=req.params, headers=req.headers, **req.body
                )
            except UNSENDABLE:
                continue
            except (httpx.ReadError, httpx.RemoteProtocolError) as exc:  # dropped mid-answer
                errors.append(f"{type(exc).__name__} {req.method} {req.path[:80]}")
                continue
            if template == "/_sandbox/faults" and req.method == "POST":
                client.delete(template)  # a fault it took would fail the requests after it
            if resp.status_code >= 500:
                errors.append(
                    f"{resp.status_code} {req.method} {req.path[:80]} "
                    f"{str(req.body)[:200]} -> {resp.text[:200]}"
                )
        still = "/.well-known/openid-configuration" if name == "idp" else "/healthz"
        assert client.get(still).status_code == 200
    assert not errors, "\n".join(errors[:30])
