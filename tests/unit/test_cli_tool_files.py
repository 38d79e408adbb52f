"""Tools as files, alone and inside an agent file: friendly names in, the Tool message out."""

from __future__ import annotations

import json

import pytest

from agentrun.v1 import tool_pb2
from agentrun_cli import agent_files, tool_files
from agentrun_cli.spec_files import SpecFileError

TOOL = {
    "name": "issue_create",
    "access": "write",
    "idempotency": "provider_key",
    "idempotency_header": "X-Request-Key",
    "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
    "connection": "tracker",
    "http": {
        "method": "POST",
        "url": "https://t.example/issues",
        "auth": "bearer",
        "body": {"issue": {"title": "{title}"}},
    },
}


def test_a_tool_file_reads_as_the_message():
    tool = tool_files.parse(TOOL)
    assert tool.access == tool_pb2.TOOL_ACCESS_WRITE
    assert tool.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
    assert json.loads(tool.parameters_json)["properties"] == {"title": {"type": "string"}}
    assert json.loads(tool.http.body) == {"issue": {"title": "{title}"}}


def test_an_unknown_key_is_named_with_the_nearest_one():
    with pytest.raises(tool_files.ToolFileError, match=r"http.methd \(did you mean http.method"):
        tool_files.parse({**TOOL, "http": {"methd": "GET"}})


def test_an_agent_file_may_define_its_tools_inline():
    file = agent_files.parse({"agent": "bot", "model": "demo", "tools": ["echo", TOOL]})
    assert list(file.spec.tools) == ["echo", "issue_create"]
    assert [t.name for t in file.tools] == ["issue_create"]


def test_a_file_that_is_not_utf8_is_named_with_its_first_bad_byte(tmp_path):
    """Tool, agent and OpenAPI files share one reader: bytes that are not UTF-8 are a
    one-line error naming the file, never a UnicodeDecodeError traceback."""
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b'{"name": "x\xff"}')
    for load in (tool_files.load, agent_files.load):
        with pytest.raises(
            SpecFileError, match=r"garbage.json: not UTF-8 text \(byte 11 is 0xff\)"
        ):
            load(str(garbage))
