"""A tool definition is validated when saved: each refusal names the field that is wrong."""

from __future__ import annotations

import json

import pytest

from agentrun.v1 import tool_pb2
from control_plane.ground.errors import InvalidArgument
from control_plane.tools import definitions

SCHEMA = {
    "type": "object",
    "properties": {"repo": {"type": "string"}, "number": {"type": "integer"}},
    "required": ["repo"],
}


def good(**changes) -> tool_pb2.Tool:
    tool = tool_pb2.Tool(
        name="issue_get",
        description="Read an issue",
        parameters_json=json.dumps(SCHEMA),
        access=tool_pb2.TOOL_ACCESS_READ,
        connection="tracker",
        http=tool_pb2.HttpTemplate(
            method="GET",
            url="https://api.example.com/repos/{repo}/issues/{number}",
            query={"fields": "all"},
            auth="bearer",
            response_pointer="/issue",
        ),
    )
    for name, value in changes.items():
        target, _, leaf = name.rpartition("__")
        holder = getattr(tool, target) if target else tool
        if isinstance(value, dict):
            getattr(holder, leaf).update(value)
        else:
            setattr(holder, leaf, value)
    return tool


def refused(tool: tool_pb2.Tool) -> str:
    with pytest.raises(InvalidArgument) as caught:
        definitions.validate(tool)
    return caught.value.field


def test_a_good_read_and_keyed_write_pass():
    definitions.validate(good())
    definitions.validate(
        good(
            access=tool_pb2.TOOL_ACCESS_WRITE,
            http__method="POST",
            idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY,
            idempotency_header="X-Request-Key",
        )
    )


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": "no spaces"}, "tool.name"),
        ({"parameters_json": "{"}, "tool.parameters_json"),
        ({"parameters_json": '{"type": "object", "properties": 3}'}, "tool.parameters_json"),
        ({"access": tool_pb2.TOOL_ACCESS_WRITE, "http__method": "POST"}, "tool.idempotency"),
        ({"idempotency": tool_pb2.IDEMPOTENCY_CLASS_NONE}, "tool.idempotency"),
        (
            {
                "access": tool_pb2.TOOL_ACCESS_WRITE,
                "idempotency": tool_pb2.IDEMPOTENCY_CLASS_LOOKUP,
            },
            "tool.lookup",
        ),
        ({"http__method": "TRACE"}, "tool.http.method"),
        ({"http__url": "/relative/{repo}"}, "tool.http.url"),
        ({"http__url": "ftp://example.com/{repo}"}, "tool.http.url"),
        ({"http__url": "https://user:pw@example.com/x"}, "tool.http.url"),
        ({"http__url": "https://example.com/{owner}/x"}, "tool.http.url"),
        ({"http__headers": {"Authorization": "Bearer abc"}}, "tool.http.headers[Authorization]"),
        ({"http__headers": {"X-Api-Key": "abc"}}, "tool.http.headers[X-Api-Key]"),
        ({"http__query": {"q": "{nope}"}}, "tool.http.query[q]"),
        ({"http__body": '{"title": "{missing}"}'}, "tool.http.body"),
        ({"http__auth": ""}, "tool.http.auth"),
        ({"connection": ""}, "tool.connection"),
        ({"http__auth": "basic"}, "tool.http.auth"),
        ({"http__timeout_seconds": 1000.0}, "tool.http.timeout_seconds"),
        ({"http__max_response_bytes": 10**9}, "tool.http.max_response_bytes"),
        ({"http__response_pointer": "issue"}, "tool.http.response_pointer"),
        ({"http__response_pointer": "/a~2b"}, "tool.http.response_pointer"),
        ({"capabilities": ["reads_minds"]}, "tool.capabilities[0]"),
    ],
)
def test_each_refusal_names_its_field(changes, field):
    tool = good()
    if "capabilities" in changes:
        tool.capabilities.extend(changes.pop("capabilities"))
    for name, value in changes.items():
        target, _, leaf = name.rpartition("__")
        holder = getattr(tool, target) if target else tool
        if isinstance(value, dict):
            getattr(holder, leaf).update(value)
        else:
            setattr(holder, leaf, value)
    assert refused(tool) == field


def test_a_tool_needs_a_transport():
    tool = good()
    tool.ClearField("http")
    assert refused(tool) == "tool.http"
