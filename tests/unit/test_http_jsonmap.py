"""The HTTP API's JSON mapping (control_plane/http/jsonmap.py): what an answer holds, and what a
request may not (each refusal naming the field as the API names it); a quiet watch's keep-alive;
the CORS origins' setting."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agentrun.v1 import approval_pb2, run_pb2
from control_plane.ground.config import ServerConfig
from control_plane.ground.errors import InvalidArgument
from control_plane.http import api, jsonmap
from control_plane.http.api import OPS


def test_an_answer_is_json_with_short_enums_numbers_and_json_values_as_json():
    run = run_pb2.Run(run_id="r", status=run_pb2.RUN_STATUS_COMPLETED)
    run.counters.tokens = 2**40
    run.create_time.FromSeconds(0)
    out = jsonmap.to_json(run)
    assert out["status"] == "completed" and out["counters"]["tokens"] == 2**40
    assert out["create_time"] == "1970-01-01T00:00:00Z"
    assert "wake_time" not in out and "queue" not in out  # unset messages are left out
    assert out["error"] == "" and out["child_run_ids"] == []  # the rest is always there

    step = jsonmap.to_json(run_pb2.Step(kind=run_pb2.STEP_KIND_TOOL_RESULT, payload_json='{"a":1}'))
    assert step["kind"] == "tool_result" and step["payload"] == {"a": 1}
    assert "payload_json" not in step
    approval = jsonmap.to_json(approval_pb2.Approval(arguments_json="[1]"))
    assert approval["arguments"] == [1] and approval["edited_arguments"] is None


def test_a_request_is_read_strictly_naming_the_field():
    def refused(message, body) -> str:
        with pytest.raises(InvalidArgument) as info:
            jsonmap.fill(message, body)
        return info.value.field

    start = run_pb2.StartRunRequest
    assert refused(start(), {"colour": "red"}) == "colour"
    assert refused(start(), {"priority": "1"}) == "priority"
    assert refused(start(), {"priority": True}) == "priority"
    assert refused(start(), {"agent_version": 2**31}) == "agent_version"
    assert refused(start(), {"input": "a\x00b"}) == "input"
    assert refused(start(), []) == "body"
    listing = run_pb2.ListRunsRequest
    assert refused(listing(), {"status": "done"}) == "status"
    assert refused(listing(), {"status": "unspecified"}) == "status"  # leave it out instead
    assert refused(listing(), {"create_after": "yesterday"}) == "create_after"
    decide = approval_pb2.DecideApprovalRequest
    assert refused(decide(), {"reject": {"reason": 5}}) == "reject.reason"
    assert refused(decide(), {"approve": {}, "edit": {}}) == "edit"
    assert refused(decide(), {"approver": "me"}) == "approver"  # deprecated: not over HTTP


def test_a_request_takes_json_values_enums_and_timestamps():
    edit = jsonmap.fill(approval_pb2.DecideApprovalRequest(), {"edit": {"arguments": {"to": "x"}}})
    assert edit.WhichOneof("decision") == "edit" and edit.edit.arguments_json == '{"to":"x"}'
    approve = jsonmap.fill(approval_pb2.DecideApprovalRequest(), {"approve": {}})
    assert approve.WhichOneof("decision") == "approve"
    listing = jsonmap.fill(
        run_pb2.ListRunsRequest(), {"status": "waiting", "create_after": "2026-01-02T03:04:05Z"}
    )
    assert listing.status == run_pb2.RUN_STATUS_WAITING
    expected = Timestamp()
    expected.FromJsonString("2026-01-02T03:04:05Z")
    assert listing.create_after == expected
    fork = jsonmap.fill(run_pb2.ForkRunRequest(), {"priority": 0})
    assert fork.HasField("priority")  # an optional scalar: set, even to 0


def test_a_domain_error_names_the_field_as_the_api_does():
    assert jsonmap.http_field("payload_json") == "payload"
    assert jsonmap.http_field("edit.arguments_json") == "edit.arguments"
    assert jsonmap.http_field("page_size") == "page_size"


def test_every_enum_the_api_speaks_has_short_names_by_its_prefix():
    seen: set[str] = set()

    def walk(desc) -> None:
        if desc.full_name in seen:
            return
        seen.add(desc.full_name)
        for field in desc.fields:
            if field.enum_type is not None:
                prefix = jsonmap._enum_prefix(field.enum_type)
                assert all(v.name.startswith(prefix) for v in field.enum_type.values), prefix
                assert "unspecified" in jsonmap.enum_names(field.enum_type, request=False)
            if field.message_type is not None:
                walk(field.message_type)

    for op in OPS:
        walk(op.request.DESCRIPTOR)
        walk(op.response.DESCRIPTOR)
    assert "agentrun.v1.Run" in seen


async def test_a_quiet_watch_sends_keep_alive_comments_between_its_events(monkeypatch):
    monkeypatch.setattr(api, "KEEP_ALIVE_SECONDS", 0.01)

    async def feed():
        await asyncio.sleep(0.1)  # a run waiting for a person
        yield run_pb2.WatchRunResponse(step=run_pb2.Step(seq=3))

    sent = [text async for text in api._kept_alive(feed())]
    assert sent[0] == ": keep-alive\n\n" and len(sent) >= 3
    assert sent[-1].startswith("event: step\nid: 3\ndata: {")


def test_the_cors_origins_are_origins_or_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://unused")
    monkeypatch.setenv("AGENTRUN_HTTP_CORS_ORIGINS", "https://app.example, http://localhost:5173/")
    assert ServerConfig.from_env().http_cors_origins == (
        "https://app.example",
        "http://localhost:5173",
    )
    monkeypatch.setenv("AGENTRUN_HTTP_CORS_ORIGINS", "app.example")
    with pytest.raises(SystemExit, match="AGENTRUN_HTTP_CORS_ORIGINS: 'app.example'"):
        ServerConfig.from_env()
