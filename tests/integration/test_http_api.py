"""The HTTP/JSON API (control_plane/http/api.py) on a real control plane and executor: the
same runs as gRPC, its errors, idempotency, the SSE watch, and its OpenAPI document, which
matches the routes, the checked-in docs/openapi.json, and what schemathesis finds served."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate as validate_openapi
from starlette.routing import Route

from agentrun.v1 import approval_pb2, run_pb2
from control_plane.http import jsonmap, openapi
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.waiting import eventually

WS = "ws"
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "openapi.json"
APP_ORIGIN = "https://app.example"  # a web front end allowed to call the API (CORS)


class Http:
    """The API over httpx with one key, paths relative to /v1/workspaces/ws/."""

    def __init__(self, base: str, key: str | None) -> None:
        headers = auth.bearer(key) if key else {}
        self.base = f"{base}/v1/workspaces/{WS}/"
        self.client = httpx.AsyncClient(headers=headers, timeout=30)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.client.get(self.base + path, **kw)

    async def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        if isinstance(body, bytes):
            return await self.client.post(self.base + path, content=body, **kw)
        return await self.client.post(self.base + path, json=body or {}, **kw)

    async def close(self) -> None:
        await self.client.aclose()


@pytest.fixture
async def stack(db_url, control_plane):
    """A control plane, an admin gRPC Api, the demo agent "mailer" (a lookup, an email, an
    answer), and an operator's HTTP client."""
    cp = control_plane(db_url, AGENTRUN_HTTP_CORS_ORIGINS=APP_ORIGIN)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("mailer", "demo", ["crm_lookup", "send_email"])
    http = Http(cp.http_url, await auth.workspace_key(db_url, WS, role="operator"))
    yield cp, api, http
    await http.close()
    await api.close()


def problem(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json", resp.headers
    body = resp.json()
    assert body["status"] == status and body["title"] and body["detail"], body
    return body


async def sse_events(http: Http, path: str, **headers: str) -> list[tuple[str, str, Any]]:
    """(event, id, data) of a watch, read until the stream ends."""
    events, event, event_id, data = [], "", "", ""
    async with http.client.stream("GET", http.base + path, headers=headers) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(
            "text/event-stream"
        )
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and event:
                events.append((event, event_id, json.loads(data)))
                event, event_id, data = "", "", ""
    return events


def conforms(value: Any, schema: dict[str, Any]) -> None:
    """`value` is valid against `schema`, a schema of docs/openapi.json (its $refs resolved)."""
    document = json.loads(DOC.read_text())
    jsonschema.Draft202012Validator({**schema, "components": document["components"]}).validate(
        value
    )


def watch_event_schemas() -> dict[str, dict[str, Any]]:
    """Each watch event's data schema in the document, by event name."""
    paths = json.loads(DOC.read_text())["paths"]
    op = paths["/v1/workspaces/{workspace_id}/runs/{run_id}/watch"]["get"]
    events = op["responses"]["200"]["content"]["text/event-stream"]["schema"]["oneOf"]
    return {
        e["properties"]["event"]["const"]: e["properties"]["data"]["contentSchema"] for e in events
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


async def test_http_and_grpc_give_the_same_run_and_steps_and_the_watch_streams_them_in_order(
    stack, executor_factory
):
    cp, api, http = stack
    started = await http.post(
        "runs", {"agent_id": "mailer", "input": "Follow up with ada@example.com"}
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["run_id"]
    executor_factory(cp)

    # Watched live from the start: the run first, then every step in seq order, then `end`.
    events = await sse_events(http, f"runs/{run_id}/watch")
    assert events[0][0] == "run" and events[-1][0] == "end"
    steps = [(e_id, data) for kind, e_id, data in events if kind == "step"]
    assert [d["seq"] for _, d in steps] == list(range(len(steps)))
    assert [int(e_id) for e_id, _ in steps] == [d["seq"] for _, d in steps]
    runs = [data for kind, _, data in events if kind == "run"]
    assert runs[-1]["status"] == "completed", runs[-1]
    schemas = watch_event_schemas()
    for kind, _, data in events:  # what schemathesis leaves out (a stream that may not end)
        conforms(data, schemas[kind])

    got = await http.get(f"runs/{run_id}")
    assert got.status_code == 200
    over_http = got.json()
    over_grpc = jsonmap.to_json(await api.get(run_id))
    assert differences(over_http, over_grpc) == []
    assert over_http["status"] == "completed" and over_http["counters"]["tool_calls"] == 2
    assert isinstance(over_http["counters"]["tokens"], int)  # int64 as a number

    listed = await http.get(f"runs/{run_id}/steps")
    assert listed.status_code == 200
    grpc_steps = (
        await api.runs.ListRunSteps(run_pb2.ListRunStepsRequest(workspace_id=WS, run_id=run_id))
    ).steps
    assert listed.json() == {"steps": [jsonmap.to_json(s) for s in grpc_steps], "next_seq": 0}
    assert [d for _, d in steps] == listed.json()["steps"]
    kinds = [s["kind"] for s in listed.json()["steps"]]
    assert kinds.count("tool_result") == 2 and kinds[-1] == "finish", kinds
    # JSON values are JSON: a step's payload is an object, not a string holding one.
    assert all(isinstance(s["payload"], dict) for s in listed.json()["steps"])

    # Resumed from Last-Event-ID (an EventSource reconnecting) or after_seq: the later steps.
    last = steps[2][0]
    resumed = await sse_events(http, f"runs/{run_id}/watch", **{"Last-Event-ID": last})
    assert [d["seq"] for k, _, d in resumed if k == "step"] == list(range(3, len(steps)))
    after = await sse_events(http, f"runs/{run_id}/watch?after_seq=4")
    assert [d["seq"] for k, _, d in after if k == "step"] == list(range(5, len(steps)))

    page = await http.get("runs", params={"status": "completed", "page_size": 1})
    assert page.status_code == 200
    assert [r["run_id"] for r in page.json()["runs"]] == [run_id]


async def test_idempotency_roles_and_errors_are_those_of_grpc(stack, db_url):
    cp, api, http = stack
    body = {"agent_id": "mailer", "input": {"ask": "a JSON value as input"}}
    first = await http.post("runs", body, headers={"Idempotency-Key": "order-7"})
    again = await http.post("runs", body, headers={"Idempotency-Key": "order-7"})
    by_body = await http.post("runs", {**body, "request_id": "order-7"})
    assert (first.status_code, again.status_code, by_body.status_code) == (201, 200, 200)
    assert first.json()["run_id"] == again.json()["run_id"] == by_body.json()["run_id"]
    assert first.json()["input"] == '{"ask":"a JSON value as input"}'
    other = await http.post("runs", body, headers={"Idempotency-Key": "order-8"})
    assert other.status_code == 201 and other.json()["run_id"] != first.json()["run_id"]
    # Paged newest first, as ListRuns pages: the token leads to the next page, "" at the end.
    page = (await http.get("runs", params={"page_size": 1})).json()
    rest = (
        await http.get("runs", params={"page_size": 1, "page_token": page["next_page_token"]})
    ).json()
    assert [r["run_id"] for r in page["runs"] + rest["runs"]] == [
        other.json()["run_id"],
        first.json()["run_id"],
    ]
    assert rest["next_page_token"] == ""

    # 401 without a credential, 403 for a reader starting a run (reading is allowed).
    anonymous = Http(cp.http_url, None)
    reader = Http(cp.http_url, await auth.workspace_key(db_url, WS, role="reader"))
    try:
        assert problem(await anonymous.get("runs"), 401)["code"] == "UNAUTHENTICATED"
        assert problem(await reader.post("runs", body), 403)["code"] == "PERMISSION_DENIED"
        assert (await reader.get(f"runs/{first.json()['run_id']}")).status_code == 200
    finally:
        await anonymous.close()
        await reader.close()

    # 400 naming the field, as the HTTP API names it.
    cases = [
        ({"agent_id": "mailer"}, "input"),
        ({**body, "priority": "high"}, "priority"),
        ({**body, "priority": 101}, "priority"),
        ({**body, "colour": "red"}, "colour"),
        ({**body, "agent_id": "Not A Slug"}, "agent_id"),
    ]
    for bad, field in cases:
        assert problem(await http.post("runs", bad), 400)["field"] == field, bad
    assert problem(await http.post("runs", b"{not json"), 400)["field"] == "body"
    run_id = first.json()["run_id"]
    # SignalRun names `payload_json`; the HTTP API's field is `payload`.
    signal = {"signal_name": "go", "event_id": "e1", "payload": "x" * 300_000}
    assert problem(await http.post(f"runs/{run_id}/signals", signal), 400)["field"] == "payload"
    surrogate = b'{"agent_id": "mailer", "input": "\\ud800"}'
    assert problem(await http.post("runs", surrogate), 400)["field"] == "body"
    assert problem(await http.get("runs", params={"status": "done"}), 400)["field"] == "status"
    assert problem(await http.get("runs", params={"page_size": 501}), 400)["field"] == ("page_size")
    assert problem(await http.get("runs/not-a-uuid"), 400)["field"] == "run_id"

    # 404 for an unknown run (and for its watch, before any stream starts).
    unknown = str(uuid.uuid4())
    assert problem(await http.get(f"runs/{unknown}"), 404)["code"] == "NOT_FOUND"
    assert problem(await http.get(f"runs/{unknown}/watch"), 404)["code"] == "NOT_FOUND"
    # A signal's payload is a JSON value and comes back as one; a cancel is 409 the second time.
    sent = await http.post(f"runs/{run_id}/signals", {**signal, "payload": {"n": 1}})
    assert sent.status_code == 201 and sent.json()["signal"]["payload"] == {"n": 1}
    assert (await http.post(f"runs/{run_id}/cancel", {"reason": "test"})).json()[
        "status"
    ] == "cancelled"
    assert problem(await http.post(f"runs/{run_id}/cancel"), 409)["code"] == ("FAILED_PRECONDITION")
    # A page of the allowed origin may call the API from a browser (a preflight, then the
    # call); another origin, or the console, is not answered for.
    preflight = {
        "Origin": APP_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
    }
    allowed = await http.client.options(http.base + "runs", headers=preflight)
    assert allowed.status_code == 200, allowed.text
    assert allowed.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    called = await http.get(f"runs/{run_id}", headers={"Origin": APP_ORIGIN})
    assert called.headers["access-control-allow-origin"] == APP_ORIGIN
    evil = await http.get(f"runs/{run_id}", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in evil.headers
    console = await http.client.get(f"{cp.http_url}/console/", headers={"Origin": APP_ORIGIN})
    assert "access-control-allow-origin" not in console.headers
    # Unknown paths and methods under /v1/ are problems too, never a bare text page.
    problem(await http.get("nothing-here"), 404)
    assert problem(await http.client.delete(http.base + "runs"), 405)
    assert (await http.client.delete(http.base + "runs")).headers["allow"] == "GET, POST"


async def test_the_document_describes_every_route_and_is_the_checked_in_file(
    stack,
):
    cp, _, _ = stack
    async with httpx.AsyncClient() as client:
        served = (await client.get(f"{cp.http_url}{openapi.PATH}")).json()
    assert served == json.loads(DOC.read_text()), (
        "docs/openapi.json is stale: make gen writes it again"
    )
    validate_openapi(served)

    # Every route under /v1/ is in the document with its methods, and every path there has
    # its route (the app the ingress serves, without a database).
    from control_plane.http.app import build_app

    documented = {(p, m.upper()) for p, ops in served["paths"].items() for m in ops}
    app = build_app(_bare_context())
    routed = set()
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith("/v1/") and "{rest" not in route.path:
            methods = route.methods or set()
            path = re.sub(r":\w+}", "}", route.path)  # {path:path} is documented as {path}
            for op_path, method in documented:
                if op_path == path and method in methods:
                    routed.add((op_path, method))
            assert any(p == path for p, _ in documented), f"{route.path} is not documented"
    assert documented == routed, documented ^ routed


def _bare_context() -> Any:
    """An HttpContext whose routes can be listed (never called): no pool is opened."""
    from control_plane.ground.config import ServerConfig
    from control_plane.http.context import HttpContext
    from control_plane.http.services import Services

    class Unused:
        def __getattr__(self, name: str) -> Any:
            return None

    fake: Any = Unused()
    services = Services(runs=fake, approvals=fake, sessions=fake, agents=fake)
    return HttpContext(
        fake, ServerConfig(database_url="postgresql://unused"), fake, services=services
    )


SCHEMATHESIS_CONFIG = """
[parameters]
"path.workspace_id" = "ws"

[phases.fuzzing]
enabled = true
"""


def test_schemathesis_finds_no_server_error_and_no_response_or_acceptance_off_the_document(
    stack, tmp_path
):
    cp, _, http = stack
    key = http.client.headers["authorization"].removeprefix("Bearer ")
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    report = tmp_path / "report.json"
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(config),
        "run",
        f"{cp.http_url}{openapi.PATH}",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,"
        "response_schema_conformance,negative_data_rejection,ignored_auth,unsupported_method",
        "--max-examples",
        "12",
        "--seed",
        "44",
        "--phases",
        "examples,coverage,fuzzing",
        # One worker: hypothesis's lambda-source parsing on two threads trips CPython 3.11's
        # "AST constructor recursion depth mismatch" (a Runtime Error of the tool, not ours).
        "--workers",
        "1",
        # A watch of a run that does not end is a stream that does not end: the SSE watch is
        # checked against the document by the test above, event by event.
        "--exclude-operation-id",
        "WatchRun",
        # The Durable Streams protocol (tag Streams: headers, text errors, long-polls and SSE
        # that outlast a request timeout) is checked by its own conformance suite
        # (test_durable_streams_conformance.py).
        "--exclude-tag",
        "Streams",
        "--request-timeout",
        "10",
        "--no-shrink",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    env = {**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"}
    # Its cache (.schemathesis/) goes to the test's directory, not the checkout.
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=170, env=env, cwd=tmp_path
    )
    (tmp_path / "schemathesis.out").write_text(done.stdout + done.stderr)
    summary = done.stdout[done.stdout.rfind("SUMMARY") :] or done.stdout[-20000:]
    print(summary)  # the counts: operations, test cases generated and passed, failures
    assert done.returncode == 0, summary + done.stderr[-3000:]


async def test_an_approval_is_listed_and_decided_over_http_by_its_approver_only(
    stack, executor_factory, db_url
):
    cp, api, operator = stack
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=["alice@example.com"])
    await api.publish("asker", "approval", ["send_email"], approval=policy)
    executor_factory(cp)
    started = await operator.post("runs", {"agent_id": "asker", "input": "Email Ada"})
    run_id = started.json()["run_id"]
    alice = Http(
        cp.http_url,
        await auth.workspace_key(db_url, WS, role="approver", principal="alice@example.com"),
    )
    try:

        async def pending() -> list[dict[str, Any]]:
            page = await alice.get("approvals", params={"state": "pending"})
            assert page.status_code == 200, page.text
            return page.json()["approvals"]

        (approval,) = await eventually(pending, timeout=30, message="no approval was requested")
        assert approval["run_id"] == run_id and approval["tool"] == "send_email"
        assert approval["arguments"]["to"] == "ada@example.com"  # a JSON value, not a string
        assert approval["edited_arguments"] is None
        path = f"approvals/{approval['approval_id']}"
        assert (await alice.get(path)).json() == approval

        # The operator may not decide (DecideApproval needs `decide`); a body naming two
        # decisions is a 400; the approver's decision is recorded as the approver's.
        assert problem(await operator.post(f"{path}/decision", {"approve": {}}), 403)
        two = {"approve": {}, "reject": {"reason": "no"}}
        assert problem(await alice.post(f"{path}/decision", two), 400)["field"] == "reject"
        decided = await alice.post(f"{path}/decision", {"approve": {}})
        assert decided.status_code == 200, decided.text
        assert decided.json()["state"] == "approved"
        assert decided.json()["decided_by"] == "alice@example.com"
        assert problem(await alice.post(f"{path}/decision", {"reject": {}}), 409)["code"] == (
            "ABORTED"
        )

        async def finished() -> dict[str, Any] | None:
            run = (await operator.get(f"runs/{run_id}")).json()
            return run if run["status"] in ("completed", "failed", "cancelled") else None

        assert (await eventually(finished, timeout=30))["status"] == "completed"
    finally:
        await alice.close()


async def test_sessions_and_agents_over_http(stack):
    cp, api, http = stack
    await api.publish("chatter", "chat", [])
    created = await http.post("sessions", {"agent_id": "chatter", "strategy": "enqueue"})
    assert created.status_code == 201, created.text
    session = created.json()
    assert (session["agent_id"], session["strategy"], session["turn_count"]) == (
        "chatter",
        "enqueue",
        0,
    )
    sid = session["session_id"]
    sent = await http.post(f"sessions/{sid}/messages", {"text": "Hello"})
    assert sent.status_code == 202, sent.text
    turns = (await http.get(f"sessions/{sid}/turns")).json()
    assert [(t["turn"], t["input"]) for t in turns["turns"]] == [(1, "Hello")]
    assert turns["next_turn"] == 0
    got = (await http.get(f"sessions/{sid}")).json()
    assert got["turn_count"] == 1 and got["last_turn"]["run_id"] == sent.json()["run_id"]

    agents = (await http.get("agents")).json()
    assert [a["agent_id"] for a in agents["agents"]] == ["chatter", "mailer"]
    assert (await http.get("agents/mailer")).json()["latest_version"] == 1
    version = (await http.get("agents/mailer/versions/0")).json()
    assert version["version"] == 1 and version["spec"]["tools"] == ["crm_lookup", "send_email"]
    assert problem(await http.get("agents/nobody"), 404)["code"] == "NOT_FOUND"
    # Read only: publishing stays with gRPC and the CLI.
    assert problem(await http.post("agents/mailer"), 405)


async def test_tags_metadata_and_pause_over_http(stack):
    """StartRun's tags and metadata (a JSON object in the body), ListRuns' tag and metadata
    query parameters, and pause/resume of a run and of an agent's queue (issue 45)."""
    _, _, http = stack
    body = {"agent_id": "mailer", "input": "hi", "tags": ["eu"], "metadata": {"k": "v"}}
    started = await http.post("runs", body)
    assert started.status_code == 201, started.text
    run = started.json()
    assert run["tags"] == ["eu"] and run["metadata"] == {"k": "v"}
    for query in ({"tag": "eu"}, {"metadata": "k=v"}):
        listed = (await http.get("runs", params=query)).json()["runs"]
        assert [r["run_id"] for r in listed] == [run["run_id"]], query
    assert (await http.get("runs", params={"tag": "other"})).json()["runs"] == []
    assert "tag" in problem(await http.get("runs", params={"tag": "Bad Tag"}), 400)["detail"]
    bad = await http.post("runs", {**body, "tags": ["x" * 65]})
    assert "tags" in problem(bad, 400)["detail"]

    paused = await http.post(f"runs/{run['run_id']}/pause")
    assert paused.status_code == 200 and paused.json()["paused"] is True, paused.text
    resumed = await http.post(f"runs/{run['run_id']}/resume")
    assert resumed.status_code == 200 and not resumed.json().get("paused"), resumed.text
    missing = await http.post(f"runs/{uuid.uuid4()}/pause")
    problem(missing, 404)
