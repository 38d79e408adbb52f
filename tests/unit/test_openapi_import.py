"""OpenAPI 3 import: documents become HTTP-template tools (control_plane/tools/openapi.py).

Pure conversion, no processes: the shop sandbox's own document, and small
documents for each rule (classes, names, collisions, servers, bad documents).
"""

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.exceptions import StarletteDeprecationWarning

from agentrun.v1 import tool_pb2
from agentrun_cli.openapi_import import write_class
from control_plane.ground.errors import InvalidArgument
from control_plane.tools.openapi import ImportSpec, import_tools, json_schema
from sandbox.providers import create_app
from sandbox.providers.shop import openapi_document

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

REPO = Path(__file__).resolve().parents[2]
SHOP = "http://shop.test/shop"
PROVIDER_KEY = tool_pb2.WriteClass(idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY)


def shop_text() -> str:
    return json.dumps(openapi_document(SHOP))


def by_name(tools: list[tool_pb2.Tool]) -> dict[str, tool_pb2.Tool]:
    return {t.name: t for t in tools}


def params(tool: tool_pb2.Tool) -> dict[str, Any]:
    return json.loads(tool.parameters_json)


NOTHING = ImportSpec()


def refused(text: str, spec: ImportSpec = NOTHING) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        import_tools(text, spec)
    return caught.value


def doc(paths: dict[str, Any], **extra: Any) -> str:
    base = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}}
    servers = [{"url": "https://api.test/v1"}]
    return json.dumps({**base, "servers": servers, "paths": paths, **extra})


def op(operation_id: str | None = None, **fields: Any) -> dict[str, Any]:
    found = {"responses": {"200": {"description": "ok"}}, **fields}
    return {**found, "operationId": operation_id} if operation_id else found


# -- the shop: two reads and one keyed write --------------------------------------------


def test_the_shop_imports_as_two_reads_and_one_provider_key_write() -> None:
    tools = by_name(import_tools(shop_text(), ImportSpec(classes={"createOrder": PROVIDER_KEY})))
    assert set(tools) == {"listProducts", "getProduct", "createOrder"}
    reads = [n for n, t in tools.items() if t.access == tool_pb2.TOOL_ACCESS_READ]
    assert sorted(reads) == ["getProduct", "listProducts"]
    write = tools["createOrder"]
    assert write.access == tool_pb2.TOOL_ACCESS_WRITE
    assert write.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
    assert write.idempotency_header == "Idempotency-Key"  # the documented header
    assert write.source == "openapi"
    assert write.http.method == "POST" and write.http.url == f"{SHOP}/orders"
    assert write.http.body == "arguments"
    assert write.description.startswith("Order a quantity of one product.")


def test_the_key_header_is_not_an_argument_and_read_only_fields_are_left_out() -> None:
    tools = by_name(import_tools(shop_text(), ImportSpec(classes={"createOrder": PROVIDER_KEY})))
    schema = params(tools["createOrder"])
    assert set(schema["properties"]) == {"sku", "quantity", "note"}  # no Idempotency-Key, no id
    assert schema["required"] == ["sku", "quantity"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["note"]["type"] == ["string", "null"]  # 3.0 nullable translated
    assert dict(tools["createOrder"].http.headers) == {}


def test_path_and_query_parameters_fill_the_template() -> None:
    tools = by_name(
        import_tools(shop_text(), ImportSpec(operations=["getProduct", "listProducts"]))
    )
    assert tools["getProduct"].http.url == f"{SHOP}/products/{{sku}}"
    assert params(tools["getProduct"])["required"] == ["sku"]
    assert dict(tools["listProducts"].http.query) == {"q": "{q}"}
    assert "required" not in params(tools["listProducts"])
    assert tools["listProducts"].http.body == ""


def test_the_served_document_names_the_address_it_was_fetched_from() -> None:
    client = TestClient(create_app(), base_url="http://127.0.0.1:4321")
    served = client.get("/shop/openapi.json").json()
    assert served["servers"] == [{"url": "http://127.0.0.1:4321/shop"}]
    tools = import_tools(json.dumps(served), ImportSpec(operations=["listProducts"]))
    assert tools[0].http.url == "http://127.0.0.1:4321/shop/products"


# -- writes and their classes -----------------------------------------------------------


def test_a_write_without_a_class_is_refused_naming_it() -> None:
    error = refused(shop_text())
    assert error.field == "classes[createOrder]"
    assert "provider_key is proposed" in str(error)


def test_a_dry_run_proposes_provider_key_for_a_documented_key_header() -> None:
    tools = by_name(import_tools(shop_text(), ImportSpec(dry_run=True)))
    proposal = tools["createOrder"]
    assert proposal.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
    assert proposal.idempotency_header == "Idempotency-Key"


def test_a_dry_run_leaves_a_write_without_a_key_header_unclassed() -> None:
    text = doc({"/notes": {"delete": op("deleteNotes")}})
    (tool,) = import_tools(text, ImportSpec(dry_run=True))
    assert tool.access == tool_pb2.TOOL_ACCESS_WRITE
    assert tool.idempotency == tool_pb2.IDEMPOTENCY_CLASS_UNSPECIFIED
    assert refused(text).field == "classes[deleteNotes]"


def test_the_stated_class_wins_over_the_proposal() -> None:
    stated = tool_pb2.WriteClass(idempotency=tool_pb2.IDEMPOTENCY_CLASS_NONE)
    tools = by_name(import_tools(shop_text(), ImportSpec(classes={"createOrder": stated})))
    assert tools["createOrder"].idempotency == tool_pb2.IDEMPOTENCY_CLASS_NONE
    assert "Idempotency-Key" not in params(tools["createOrder"])["properties"]


def test_a_stated_provider_key_header_and_retention_are_kept() -> None:
    stated = tool_pb2.WriteClass(
        idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY,
        idempotency_header="X-Dedupe",
        key_retention_hours=24,
    )
    (tool,) = import_tools(shop_text(), ImportSpec(["createOrder"], {"createOrder": stated}))
    assert (tool.idempotency_header, tool.key_retention_hours) == ("X-Dedupe", 24)


@pytest.mark.parametrize(
    ("classes", "field"),
    [
        ({"getProduct": PROVIDER_KEY}, "classes[getProduct]"),
        ({"createOrdr": PROVIDER_KEY}, "classes[createOrdr]"),
    ],
)
def test_a_class_for_a_read_or_an_unknown_operation_is_refused(classes, field) -> None:
    assert refused(shop_text(), ImportSpec(classes=classes)).field == field


def test_an_unknown_operation_is_refused_naming_its_entry() -> None:
    error = refused(shop_text(), ImportSpec(operations=["getProduct", "nope"]))
    assert error.field == "operations[1]"
    assert "createOrder" in str(error)  # says which there are


# -- names, collisions, servers, auth ---------------------------------------------------


def test_an_operation_without_an_id_gets_a_derived_name() -> None:
    user = {"name": "user-id", "in": "path", "required": True, "schema": {"type": "string"}}
    text = doc({"/users/{user-id}/items": {"get": op(None, parameters=[user])}})
    (tool,) = import_tools(text, ImportSpec(operations=["get_users_user_id_items"]))
    assert tool.name == "get_users_user_id_items"
    assert tool.http.url == "https://api.test/v1/users/{user_id}/items"
    assert params(tool)["required"] == ["user_id"]


def test_an_operation_id_is_sanitized_to_the_tool_name_rule() -> None:
    (tool,) = import_tools(doc({"/a": {"get": op("pets.list all" + "x" * 80)}}), ImportSpec())
    assert tool.name.startswith("pets_list_all") and len(tool.name) == 64


def test_two_operations_with_one_tool_name_are_refused() -> None:
    text = doc({"/a": {"get": op("a.b")}, "/b": {"get": op("a b")}})
    assert refused(text).field == "operations"


def test_a_body_property_named_like_a_parameter_becomes_body_name() -> None:
    body = {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["id", "name"],
                    "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
                }
            }
        },
    }
    path = {
        "put": op(
            "putUser",
            requestBody=body,
            parameters=[
                {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}},
                {"name": "X-Trace-Id", "in": "header", "schema": {"type": "string"}},
                {"name": "Authorization", "in": "header", "schema": {"type": "string"}},
                {"name": "X-API-Key", "in": "header", "schema": {"type": "string"}},
                {"name": "2fa", "in": "query", "schema": {"type": "string"}},
            ],
        )
    }
    classes = {"putUser": tool_pb2.WriteClass(idempotency=tool_pb2.IDEMPOTENCY_CLASS_NONE)}
    (tool,) = import_tools(doc({"/users/{id}": path}), ImportSpec(classes=classes))
    schema = params(tool)
    assert set(schema["properties"]) == {"id", "X_Trace_Id", "_2fa", "body_id", "name"}
    assert schema["properties"]["id"]["type"] == "integer"
    assert schema["required"] == ["id", "body_id", "name"]
    assert json.loads(tool.http.body) == {"id": "{body_id}", "name": "{name}"}
    assert dict(tool.http.headers) == {"X-Trace-Id": "{X_Trace_Id}"}  # no credential header
    assert dict(tool.http.query) == {"2fa": "{_2fa}"}


def test_a_relative_server_needs_base_url() -> None:
    text = doc({"/a": {"get": op("a")}}, servers=[{"url": "/v2"}])
    assert refused(text).field == "base_url"
    (tool,) = import_tools(text, ImportSpec(base_url="http://localhost:9/api/"))
    assert tool.http.url == "http://localhost:9/api/a"
    assert refused(text, ImportSpec(base_url="localhost:9")).field == "base_url"


def test_server_variables_take_their_defaults() -> None:
    servers = [{"url": "https://{region}.api.test", "variables": {"region": {"default": "eu"}}}]
    (tool,) = import_tools(doc({"/a": {"get": op("a")}}, servers=servers), ImportSpec())
    assert tool.http.url == "https://eu.api.test/a"


def test_a_connection_takes_its_auth_from_the_security_scheme() -> None:
    components = {"securitySchemes": {"key": {"type": "apiKey", "in": "header", "name": "X-Key"}}}
    text = doc({"/a": {"get": op("a")}}, components=components, security=[{"key": []}])
    (tool,) = import_tools(text, ImportSpec(connection="acme"))
    assert (tool.connection, tool.http.auth) == ("acme", "header:X-Key")
    (tool,) = import_tools(text, ImportSpec(connection="acme", auth="bearer"))
    assert tool.http.auth == "bearer"
    (tool,) = import_tools(text, ImportSpec())
    assert (tool.connection, tool.http.auth) == ("", "")


def test_yaml_documents_import_too() -> None:
    text = yaml.safe_dump(openapi_document(SHOP))
    assert len(import_tools(text, ImportSpec(dry_run=True))) == 3


@pytest.mark.parametrize("version", ["3.0", "3.1"])
def test_the_canonical_petstore_documents_import_alike(version: str) -> None:
    """openapi-spec-validator's Petstore test data (tests/data/openapi): 3.1 writes its
    response code unquoted (`200:`, a YAML integer) and its path item as a $ref."""
    text = (REPO / "tests" / "data" / "openapi" / f"petstore-{version}.yaml").read_text()
    tools = by_name(import_tools(text, ImportSpec(dry_run=True)))
    assert list(tools) == ["listPets", "createPets", "showPetById"]
    assert tools["showPetById"].http.url == "http://petstore.swagger.io/v1/pets/{petId}"
    assert params(tools["listPets"])["properties"]["limit"]["type"] == "integer"
    assert params(tools["showPetById"])["required"] == ["petId"]


def test_yaml_keys_json_has_no_form_for_are_refused_naming_the_document() -> None:
    error = refused("openapi: 3.1.0\n? [1, 2]\n: x\n")
    assert error.field == "document" and "neither JSON nor YAML" in str(error)
    error = refused("openapi: 3.1.0\nx: !!binary aGk=\n")
    assert str(error) == "document: is not JSON data: Object of type bytes is not JSON serializable"


def test_a_recursive_schema_is_cut_where_it_recurses() -> None:
    node = {"type": "object", "properties": {"child": {"$ref": "#/components/schemas/Node"}}}
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}
    text = doc(
        {"/n": {"post": op("postNode", requestBody=body)}},
        components={"schemas": {"Node": node}},
    )
    (tool,) = import_tools(text, ImportSpec(dry_run=True))
    assert params(tool)["properties"] == {"child": {}}  # the body is a Node; a child, anything


def test_openapi_30_quirks_become_json_schema() -> None:
    assert json_schema({"type": "integer", "minimum": 1, "exclusiveMinimum": True}) == {
        "type": "integer",
        "exclusiveMinimum": 1,
    }
    converted = json_schema({"properties": {"example": {"type": "string", "example": "x"}}})
    assert converted == {"properties": {"example": {"type": "string"}}}


# -- bad documents: INVALID_ARGUMENT naming `document` ----------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty"),
        ("{not: [valid", "neither JSON nor YAML"),
        ("[1, 2]", "must be a JSON or YAML object"),
        ('{"swagger": "2.0"}', "Swagger 2.0"),
        ('{"openapi": "3.0.3", "info": {"title": "t"}, "paths": {}}', "'version' is a required"),
        (doc({"/a": {"get": {"operationId": "a"}}}, openapi="3.0.3"), "'responses' is a required"),
        (doc({}), "has no operations"),
        ("[" * 5000 + "]" * 5000, "nested more than"),
        (
            "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(
                f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                for p, n in zip("abcdefg", "bcdefgh", strict=True)
            ),
            "nodes",
        ),  # billion laughs
        (doc({"/a": {"get": op("a", parameters=[{"$ref": "other.yaml#/p"}])}}), "only local"),
        (doc({"/a": {"get": op("a", parameters=[{"$ref": "#/components/parameters/x"}])}}), ""),
    ],
)
def test_a_bad_document_is_refused_naming_it(text: str, says: str) -> None:
    error = refused(text)
    assert error.field == "document"
    # The validator quotes a key '…' or "…" as its backend is jsonschema or jsonschema-rs
    # (schemathesis, a dev tool, brings the latter).
    assert says.replace("'", '"') in str(error).replace("'", '"')
    assert "\n" not in str(error)  # the first line only


def test_a_non_json_body_is_refused() -> None:
    body = {"content": {"multipart/form-data": {"schema": {"type": "object"}}}}
    error = refused(doc({"/f": {"post": op("upload", requestBody=body)}}), ImportSpec(dry_run=True))
    assert error.field == "operations" and "multipart/form-data" in str(error)


def test_the_example_document_is_the_one_the_shop_serves() -> None:
    example = yaml.safe_load((REPO / "examples" / "shop.openapi.yaml").read_text())
    assert example == openapi_document("http://providers:8020/shop")


# -- the CLI's --class ------------------------------------------------------------------


def test_the_cli_reads_a_stated_class() -> None:
    assert write_class("createOrder=provider_key:X-Dedupe") == (
        "createOrder",
        tool_pb2.WriteClass(
            idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY, idempotency_header="X-Dedupe"
        ),
    )
    assert write_class("post=none")[1].idempotency == tool_pb2.IDEMPOTENCY_CLASS_NONE
    for bad in ("createOrder", "=none", "op=lookup", "op=none:X-Key", "op=maybe"):
        with pytest.raises(argparse.ArgumentTypeError):
            write_class(bad)
