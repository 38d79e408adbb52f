"""A registry HTTP tool's call as a request: escaping, headers, query, body, response pointer;
its definition as the executor's Tool; and the MCP hook before its transport exists."""

from __future__ import annotations

import json

import pytest

from agentrun.v1 import tool_pb2
from executor.config import ExecutorConfig
from executor.tools import credentials, definitions, template
from executor.tools.catalogue import Catalogue
from executor.tools.credentials import Credential, Granted
from executor.tools.delivery import ToolDelivery
from executor.tools.http_tool import HttpToolClient
from executor.tools.rejection import ToolCallRejected
from executor.tools.send_errors import MaybeSent, NotSent
from executor.tools.template import HttpTemplate
from tests.harness.http_stub import DROP, reply, serving


def tpl(**fields) -> HttpTemplate:
    base = {
        "method": "POST",
        "url": "https://api.example/repos/{repo}/issues",
        "headers": {},
        "query": {},
    }
    return HttpTemplate(**{**base, **fields})


def test_a_path_argument_is_escaped_as_one_segment():
    rendered = template.render(tpl(), {"repo": "acme/web#1?x"})
    assert rendered.url == "https://api.example/repos/acme%2Fweb%231%3Fx/issues"
    with pytest.raises(ToolCallRejected):
        template.render(tpl(), {})


def test_headers_query_and_the_body_take_what_they_name():
    t = tpl(
        headers={"X-Trace": "t-{trace}", "Accept-Language": "en"},
        query={"state": "{state}", "page": "{page}"},
        body="arguments",
    )
    rendered = template.render(t, {"repo": "r", "trace": "9", "state": "open", "title": "Bug"})
    assert rendered.headers == {"X-Trace": "t-9", "Accept-Language": "en"}
    assert rendered.params == {"state": "open"}  # page: no argument, left out
    assert rendered.body == {"title": "Bug"}  # what the URL, headers and query did not use
    shaped = tpl(body=json.dumps({"issue": {"title": "{title}", "n": "{n}", "note": "by {who}"}}))
    assert template.render(shaped, {"repo": "r", "title": "Bug", "n": 3}).body == {
        "issue": {"title": "Bug", "n": 3}
    }


def test_the_pointer_picks_the_result():
    document = {"data": {"items": [{"a/b": 1}, {"x": 2}]}}
    assert template.pointed(document, "/data/items/0/a~1b") == 1
    assert template.pointed(document, "/data/items/1") == {"x": 2}
    assert template.pointed(document, "") == document


@pytest.mark.parametrize(
    ("pointer", "where"),
    [
        ("/nope", "no 'nope' in its top level"),
        ("/data/items/2", "no '2' in /data/items"),
        ("/data/items/-", "no '-' in /data/items"),  # past the end: no member
        ("/data/items/01", "no '01' in /data/items"),  # RFC 6901: no leading zeros
        ("/data/items/0/a~1b/c", "no 'c' in /data/items/0/a~1b"),
    ],
)
def test_a_pointer_with_nothing_there_is_refused_naming_it_never_the_whole_answer(pointer, where):
    document = {"data": {"items": [{"a/b": 1}, {"x": 2}]}}
    with pytest.raises(template.NothingAtPointer) as refused:
        template.pointed(document, pointer)
    assert str(refused.value) == (
        f"the answer has nothing at response_pointer {pointer!r} ({where})"
    )


async def test_an_answer_without_the_pointer_fails_the_call_once_and_shows_none_of_it():
    """A real provider answers 200 without the member the tool's pointer names: the call was
    applied, so it is not sent again, and it fails naming the pointer; the model never sees
    the answer (a typo in a pointer used to hand it the whole body)."""
    async with serving(lambda r: reply(json={"items": [{"secret": "s" * 50}]})) as stub:
        proto = registry_tool(url=f"{stub.url}/issues")
        proto.http.auth, proto.http.response_pointer = "", "/data/id"
        client = HttpToolClient(ExecutorConfig())
        delivery = ToolDelivery(client, sleep=_no_wait)
        outcome = await delivery.send(definitions.from_proto(proto), {}, "run:8", lambda: None)
        await client.aclose()
    assert len(stub.seen) == 1
    assert outcome.status == "error" and outcome.output is None
    assert outcome.error == (
        "issue_create: the provider answered 200, but the answer has nothing at "
        "response_pointer '/data/id' (no 'data' in its top level)"
    )


async def _no_wait(seconds: float) -> None:
    return None


def registry_tool(
    name: str = "issue_create",
    mcp: tool_pb2.McpTarget | None = None,
    url: str = "https://t.example/issues",
):
    tool = tool_pb2.Tool(
        name=name,
        version=3,
        parameters_json='{"type": "object"}',
        access=tool_pb2.TOOL_ACCESS_WRITE,
        idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY,
        idempotency_header="X-Request-Key",
        connection="tracker",
        http=tool_pb2.HttpTemplate(method="POST", url=url, auth="bearer"),
    )
    if mcp is not None:
        tool.mcp.CopyFrom(mcp)
    return tool


def test_a_definition_becomes_a_tool_that_shadows_a_builtin_for_its_run():
    tool = definitions.from_proto(registry_tool())
    assert (tool.call_class, tool.idempotency_header, tool.provider) == (
        "provider_key",
        "X-Request-Key",
        "tracker",
    )
    assert credentials.required_scope(tool) == "tracker:write"
    shadow = registry_tool(name="echo")
    run = definitions.for_run(Catalogue.load(), [shadow])
    assert run.tools["echo"].http is not None and run.tools["crm_upsert"].http is None


async def test_the_token_goes_in_the_header_auth_names_and_only_there():
    client = HttpToolClient(ExecutorConfig())

    async def fetch(connection_id: str) -> Granted:
        return Granted(("tracker:write",), "tok-123")

    async with serving(lambda r: reply(json={"id": 7, "echo": "tok-123"})) as stub:
        tool = definitions.from_proto(registry_tool(url=f"{stub.url}/issues"))
        out = await client.send(tool, {}, "run:4", Credential("c1", fetch, "tracker:write"))
        with pytest.raises(NotSent):  # a tool that sends a token and has none: nothing leaves
            await client.send(tool, {}, "run:5", None)
        await client.aclose()
    seen = stub.seen
    assert len(seen) == 1 and seen[0].headers["authorization"] == "Bearer tok-123"
    assert seen[0].headers["x-request-key"] == "run:4"
    assert out == {"id": 7, "echo": "[redacted]"}  # an echoed token never reaches the step


async def test_a_put_whose_connection_broke_may_have_applied_and_is_not_resent_by_the_client():
    """aiohttp would resend an idempotent method once on its own; the tool client does not:
    whether to send again is the delivery's to decide, by the tool's class."""
    proto = registry_tool()
    proto.http.auth = ""
    async with serving(lambda r: DROP) as stub:
        proto.http.method, proto.http.url = "PUT", f"{stub.url}/issues/{{id}}"
        client = HttpToolClient(ExecutorConfig())
        with pytest.raises(MaybeSent, match="ServerDisconnectedError"):
            await client.send(definitions.from_proto(proto), {"id": "a/b c?#"}, "run:7")
        await client.aclose()
    assert [(s.method, s.target) for s in stub.seen] == [("PUT", "/issues/a%2Fb%20c%3F%23")]


async def test_an_mcp_tool_is_not_sent_until_its_transport_exists():
    mcp = registry_tool(mcp=tool_pb2.McpTarget(server_id="s", tool="t", url="http://m/mcp"))
    client = HttpToolClient(ExecutorConfig())
    try:
        import executor.tools.mcp_call  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(NotSent, match="mcp transport not available"):
            await client.send(definitions.from_proto(mcp), {}, "run:1")
    await client.aclose()


async def test_a_header_auth_sends_the_bare_token_and_a_long_answer_is_not_kept():
    client = HttpToolClient(ExecutorConfig())

    async def fetch(connection_id: str) -> Granted:
        return Granted(("tracker:write",), "tok-9")

    big = reply(content=b'{"big": "' + b"x" * 5000 + b'"}')
    async with serving(lambda r: big) as stub:
        proto = registry_tool(url=f"{stub.url}/issues")
        proto.http.auth, proto.http.max_response_bytes = "header:X-Api-Token", 1000
        out = await client.send(definitions.from_proto(proto), {}, "run:6", Credential("c", fetch))
        await client.aclose()
    seen = stub.seen
    assert seen[0].headers["x-api-token"] == "tok-9" and "authorization" not in seen[0].headers
    size = len(big.body)
    assert out == {
        "error": f"the response was {size} bytes, over the tool's max_response_bytes 1000: "
        "not kept",
        "status": 200,
    }


def test_a_call_whose_url_cannot_be_built_is_refused_before_it_starts():
    proto = registry_tool()
    proto.http.url = "https://t.example/repos/{repo}/issues"
    proto.parameters_json = '{"type": "object", "properties": {"repo": {"type": "string"}}}'
    run = definitions.for_run(Catalogue.load(), [proto])
    with pytest.raises(ToolCallRejected, match="'repo' is needed"):
        run.check_call("issue_create", {}, ["issue_create"])
    assert run.check_call("issue_create", {"repo": "a/b"}, ["issue_create"]).http is not None
