"""Where a workspace's tools may connect (ground/netguard.py) and the save-time
check of literal addresses in definitions (control_plane/tools/definitions.py)."""

from __future__ import annotations

import ipaddress
import json

import pytest

from agentrun.v1 import tool_pb2
from control_plane.ground.errors import InvalidArgument
from control_plane.tools import definitions
from control_plane.tools.openapi import ImportSpec, import_tools
from ground import netguard
from sandbox.providers.shop import openapi_document

ALWAYS = [
    "169.254.169.254",
    "169.254.0.1",
    "fe80::1",
    "0.0.0.0",
    "::",
    "224.0.0.1",
    "ff02::1",
    "255.255.255.255",
    "::ffff:169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "2002:a9fe:a9fe::1",
]
PRIVATE = [
    "127.0.0.1",
    "::1",
    "10.1.2.3",
    "172.16.0.9",
    "192.168.1.1",
    "fd00::1",
    "::ffff:127.0.0.1",
]
PUBLIC = ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"]


def test_link_local_unspecified_and_multicast_are_always_refused(monkeypatch):
    monkeypatch.delenv(netguard.ENV, raising=False)
    for text in ALWAYS:
        assert netguard.refused(ipaddress.ip_address(text)), text
    for text in PRIVATE + PUBLIC:
        assert not netguard.refused(ipaddress.ip_address(text)), text


def test_private_and_loopback_are_refused_only_when_the_operator_says_so(monkeypatch):
    for value in ("deny", "DENY", "no-such-value"):  # a typo fails closed
        monkeypatch.setenv(netguard.ENV, value)
        for text in ALWAYS + PRIVATE:
            assert netguard.refused(ipaddress.ip_address(text)), (value, text)
        for text in PUBLIC:
            assert not netguard.refused(ipaddress.ip_address(text)), (value, text)
    monkeypatch.setenv(netguard.ENV, "allow")
    assert not netguard.refused(ipaddress.ip_address("127.0.0.1"))


def http_tool(url: str, lookup_url: str = "") -> tool_pb2.Tool:
    tool = tool_pb2.Tool(
        name="fetch",
        parameters_json='{"type": "object"}',
        access=tool_pb2.TOOL_ACCESS_READ,
        http=tool_pb2.HttpTemplate(method="GET", url=url),
    )
    if lookup_url:
        tool.access, tool.idempotency = (
            tool_pb2.TOOL_ACCESS_WRITE,
            tool_pb2.IDEMPOTENCY_CLASS_LOOKUP,
        )
        tool.lookup.CopyFrom(
            tool_pb2.ToolLookup(
                stamp_body_field="m",
                stamp_name="k",
                url=lookup_url,
                query={"k": "{key}"},
                matches="found",
            )
        )
    return tool


def mcp_tool(url: str, timeout: float = 0.0) -> tool_pb2.Tool:
    return tool_pb2.Tool(
        name="desk__list",
        parameters_json='{"type": "object"}',
        access=tool_pb2.TOOL_ACCESS_READ,
        mcp=tool_pb2.McpTarget(server_id="desk", tool="list", url=url, timeout_seconds=timeout),
    )


def refusal(tool: tool_pb2.Tool) -> str:
    with pytest.raises(InvalidArgument) as refused:
        definitions.validate(tool)
    return str(refused.value)


def test_a_definition_naming_a_refused_literal_address_is_not_saved(monkeypatch):
    monkeypatch.delenv(netguard.ENV, raising=False)
    assert "tool.http.url" in refusal(http_tool("http://169.254.169.254/latest/meta-data"))
    assert "tool.http.url" in refusal(http_tool("http://[fe80::1]:8080/{x}"))
    assert "tool.lookup.url" in refusal(http_tool("https://api.example/x", "http://0.0.0.0/q"))
    assert "tool.mcp.url" in refusal(mcp_tool("http://[::ffff:169.254.169.254]/mcp"))
    definitions.validate(http_tool("http://127.0.0.1:8080/local"))  # allowed by default
    definitions.validate(http_tool("http://metadata.example/x"))  # a name: checked at call time

    monkeypatch.setenv(netguard.ENV, "deny")
    why = refusal(http_tool("http://10.0.0.5/admin"))
    assert "tool.http.url" in why and f"{netguard.ENV}=deny" in why
    definitions.validate(http_tool("https://93.184.216.34/public"))


def test_an_mcp_tool_timeout_is_bounded_when_saved():
    definitions.validate(mcp_tool("https://mcp.example/mcp", timeout=12.5))
    for bad in (-1.0, 301.0, float("nan")):
        assert "tool.mcp.timeout_seconds" in refusal(mcp_tool("https://mcp.example/mcp", bad))


def test_an_openapi_import_refuses_a_server_the_tools_may_not_reach(monkeypatch):
    monkeypatch.delenv(netguard.ENV, raising=False)
    document = json.dumps(openapi_document("http://169.254.169.254/shop"))
    with pytest.raises(InvalidArgument) as refused:
        import_tools(document, ImportSpec(operations=["getProduct"], dry_run=True))
    assert str(refused.value).startswith("base_url")  # the document's servers[0]
    with pytest.raises(InvalidArgument, match="^base_url"):
        import_tools(
            document,
            ImportSpec(operations=["getProduct"], dry_run=True, base_url="http://[fe80::1]/shop"),
        )
    tools = import_tools(
        document,
        ImportSpec(operations=["getProduct"], dry_run=True, base_url="https://shop.example"),
    )
    assert tools[0].http.url.startswith("https://shop.example/")


# Each numeric spelling (WHATWG URL / inet_aton) with the dotted address it spells.
SPELLINGS = [
    ("2852039166", "169.254.169.254"),
    ("0251.0376.0251.0376", "169.254.169.254"),
    ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
    ("0xA9FEA9FE", "169.254.169.254"),
    ("169.16689662", "169.254.169.254"),
    ("0", "0.0.0.0"),
    ("127.1", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("10.1", "10.0.0.1"),
]


@pytest.mark.parametrize(("spelled", "dotted"), SPELLINGS)
@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_every_numeric_ipv4_spelling_is_judged_as_its_dotted_address(
    monkeypatch, spelled, dotted, policy
):
    monkeypatch.setenv(netguard.ENV, policy)
    tool = http_tool(f"http://{spelled}:8080/latest/meta-data")
    if netguard.literal_refusal(dotted) is None:
        definitions.validate(tool)
    else:
        assert refusal(tool) == f"tool.http.url: {netguard.literal_refusal(dotted)}"
        assert "tool.mcp.url" in refusal(mcp_tool(f"http://{spelled}/mcp"))
    assert netguard.literal_refusal(spelled) == netguard.literal_refusal(dotted)
    assert netguard.address_of(spelled) == ipaddress.ip_address(dotted)


def test_a_host_ending_in_a_number_that_spells_no_address_is_refused(monkeypatch):
    monkeypatch.delenv(netguard.ENV, raising=False)
    for host in ("1.2.3.4.5", "09", "256.1.1.1", "0x1.0x100000000"):
        assert "tool.http.url" in refusal(http_tool(f"http://{host}/x")), host
    for name in ("metadata.example", "localhost", "a0.example", "v1.api.example"):
        assert netguard.address_of(name) is None, name
        definitions.validate(http_tool(f"https://{name}/x"))


@pytest.mark.parametrize("spelled", ["127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1"])
async def test_a_numeric_spelling_is_refused_at_send_time_like_its_dotted_form(
    monkeypatch, spelled
):
    """A definition saved before this check (or by a bug) is stopped when sent: a real
    server listens on 127.0.0.1, and a loopback refused by the operator is refused
    whichever way the tool's URL spells it."""
    from executor.config import ExecutorConfig
    from executor.tools import definitions as executor_definitions
    from executor.tools.http_tool import HttpToolClient
    from executor.tools.send_errors import Blocked
    from tests.harness.http_stub import reply, serving

    monkeypatch.setenv(netguard.ENV, "deny")
    async with serving(lambda r: reply(json={"ok": True})) as stub:
        port = stub.url.rsplit(":", 1)[1].split("/", 1)[0]
        proto = http_tool(f"http://{spelled}:{port}/x")
        client = HttpToolClient(ExecutorConfig())
        with pytest.raises(Blocked, match=repr(spelled)):
            await client.send(executor_definitions.from_proto(proto), {}, "run:1")
        await client.aclose()
    assert stub.seen == []


async def test_an_allowed_numeric_spelling_is_sent_to_the_address_it_was_judged_as(monkeypatch):
    """With loopback allowed, `127.1` is 127.0.0.1 for the guard and for the connection alike
    (aiohttp alone refuses it as no canonical address)."""
    from executor.config import ExecutorConfig
    from executor.tools import definitions as executor_definitions
    from executor.tools.http_tool import HttpToolClient
    from tests.harness.http_stub import reply, serving

    monkeypatch.setenv(netguard.ENV, "allow")
    async with serving(lambda r: reply(json={"ok": True})) as stub:
        port = stub.url.rsplit(":", 1)[1].split("/", 1)[0]
        proto = http_tool(f"http://127.1:{port}/x")
        client = HttpToolClient(ExecutorConfig())
        answer = await client.send(executor_definitions.from_proto(proto), {}, "run:2")
        await client.aclose()
    assert answer == {"ok": True} and [s.target for s in stub.seen] == ["/x"]
