"""OpenAPI import through ToolService.ImportOpenApi (in-process control plane, real Postgres),
of the document the shop sandbox serves over real HTTP: two reads and one keyed write; a
write without its class, or a bad document, refused naming the field with nothing saved."""

from __future__ import annotations

import grpc
import httpx
import pytest

from agentrun.v1 import tool_pb2, tool_pb2_grpc
from tests.harness import auth

KEYED = tool_pb2.WriteClass(idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY)


async def stub(server, db_url: str, ws: str = "acme"):
    key = await auth.workspace_key(db_url, ws, role="admin")
    channel = auth.channel(f"127.0.0.1:{server.port}", key)
    return channel, tool_pb2_grpc.ToolServiceStub(channel)


def shop_document(providers_url: str) -> str:
    response = httpx.get(f"{providers_url}/shop/openapi.json", timeout=10)
    response.raise_for_status()
    return response.text


async def saved_count(db) -> int:
    return await db.fetchval("SELECT count(*) FROM tools WHERE workspace_id = 'acme'")


async def test_the_shop_document_imports_as_two_reads_and_one_keyed_write(
    server, db_url, db, sandbox_providers
):
    document = shop_document(sandbox_providers.url)
    channel, tools = await stub(server, db_url)
    async with channel:
        proposed = await tools.ImportOpenApi(
            tool_pb2.ImportOpenApiRequest(document=document, dry_run=True)
        )
        assert await saved_count(db) == 0  # a dry run saves nothing
        proposal = {t.name: t for t in proposed.tools}["createOrder"]
        assert proposal.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
        assert proposal.idempotency_header == "Idempotency-Key"
        imported = await tools.ImportOpenApi(
            tool_pb2.ImportOpenApiRequest(document=document, classes={"createOrder": KEYED})
        )
        listed = {t.name: t for t in (await tools.ListTools(tool_pb2.ListToolsRequest())).tools}
    access = {t.name: t.access for t in imported.tools}
    assert access == {
        "listProducts": tool_pb2.TOOL_ACCESS_READ,
        "getProduct": tool_pb2.TOOL_ACCESS_READ,
        "createOrder": tool_pb2.TOOL_ACCESS_WRITE,
    }
    write = listed["createOrder"]
    assert (write.version, write.source, write.workspace_id) == (1, "openapi", "acme")
    assert write.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
    assert write.http.url == f"{sandbox_providers.url}/shop/orders"
    assert write.created_by.startswith("key:")
    assert await saved_count(db) == 3


REFUSALS = [
    ({}, "classes[createOrder]"),  # the write, without its class
    ({"operations": ["getProduct", "nope"]}, "operations[1]"),
    ({"classes": {"getProduct": KEYED}}, "classes[getProduct]"),
    ({"base_url": "ftp://shop"}, "base_url"),
    ({"connection": "Shop Inc", "classes": {"createOrder": KEYED}}, "tool.connection"),
]
BAD_DOCUMENTS = ["openapi: 3.0.3\ninfo: {title: t}\npaths: {}\n", "{[", "swagger: '2.0'"]


async def test_a_refused_import_names_the_field_and_saves_nothing(
    server, db_url, db, sandbox_providers
):
    document = shop_document(sandbox_providers.url)
    asks = [(tool_pb2.ImportOpenApiRequest(document=document, **fields), field)
            for fields, field in REFUSALS]  # fmt: skip
    asks += [(tool_pb2.ImportOpenApiRequest(document=bad), "document") for bad in BAD_DOCUMENTS]
    channel, tools = await stub(server, db_url)
    async with channel:
        for request, field in asks:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await tools.ImportOpenApi(request)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith(f"{field}:"), refused.value.details()
    assert await saved_count(db) == 0
