"""Role projections (issue 42 item 4, docs/streams.md "What each role sees"): a reader key
and an operator key read the same session turn's run through every door a step leaves by
(ListRunSteps, WatchRun, the HTTP run and session streams, gRPC ReadStream): the reader
never sees the executor's bookkeeping or the provider's raw fields, the operator sees every
step whole, and both see the same steps in the same order.

Real server, executor and sandbox model; the run is `echo_input` (a decision calling echo,
its start and result, the answer).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentrun.v1 import (
    run_pb2,
    run_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    stream_pb2,
    stream_pb2_grpc,
)
from tests.harness import auth
from tests.harness.agentrun_api import Api

WS = "ws"
# Fields a reader never sees, by step kind (control_plane/auth/privacy.py INTERNAL_FIELDS).
HIDDEN = {
    "model_decision": {"response_id", "stop_reason"},
    "tool_started": {"idempotency_key"},
}


def payloads(steps: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(s["kind"], s["payload"]) for s in steps]


def check(seen: list[tuple[str, dict[str, Any]]], whole: bool, door: str) -> None:
    """Every hidden field present (an operator) or absent (a reader) in every step."""
    kinds = [k for k, _ in seen]
    assert {"model_decision", "tool_started", "tool_result", "finish"} <= set(kinds), door
    for kind, payload in seen:
        for field in HIDDEN.get(kind, ()):
            assert (field in payload) == whole, (door, kind, field, payload)
        if kind == "model_decision":  # what the run did stays: content, calls, usage
            assert "usage" in payload and "tool_calls" in payload, (door, payload)
        if kind == "tool_started":
            assert payload["tool"] == "echo" and "arguments" in payload, (door, payload)


async def test_a_reader_sees_projections_and_an_operator_every_step_whole(
    db_url, control_plane, executor_factory, sandbox_model, sandbox_providers
) -> None:
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("echoer", "echo_input", ["echo"])
    sessions = session_pb2_grpc.SessionServiceStub(api.channel)
    made = await sessions.CreateSession(
        session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="echoer")
    )
    session_id = made.session.session_id
    turn = await sessions.SendMessage(
        session_pb2.SendMessageRequest(workspace_id=WS, session_id=session_id, text="hello")
    )
    run_id = turn.turn.run_id
    executor_factory(cp)
    (ended,) = await api.wait_terminal([run_id], within=60)
    assert ended.status == run_pb2.RUN_STATUS_COMPLETED, ended.error

    reads: dict[str, list[list[tuple[str, dict[str, Any]]]]] = {}
    for role in ("reader", "operator"):
        key = await auth.workspace_key(db_url, WS, role=role, principal=f"{role}-1")
        channel = auth.channel(cp.address, key)
        runs = run_pb2_grpc.RunServiceStub(channel)
        listed = await runs.ListRunSteps(
            run_pb2.ListRunStepsRequest(workspace_id=WS, run_id=run_id)
        )
        by_list = [(run_pb2.StepKind.Name(s.kind), s.payload_json) for s in listed.steps]
        watch = runs.WatchRun(run_pb2.WatchRunRequest(workspace_id=WS, run_id=run_id))
        by_watch = [
            (run_pb2.StepKind.Name(w.step.kind), w.step.payload_json)
            async for w in watch
            if w.HasField("step")
        ]
        streams = stream_pb2_grpc.StreamServiceStub(channel)
        read = streams.ReadStream(
            stream_pb2.ReadStreamRequest(
                workspace_id=WS, path=f"_agentrun/runs/{run_id}", offset="-1"
            )
        )
        by_grpc_stream = [json.loads(r.data)[0]["step"] async for r in read if r.data]
        await channel.close()
        base = f"{cp.http_url}/v1/workspaces/{WS}/streams/_agentrun"
        async with httpx.AsyncClient(headers=auth.bearer(key), timeout=30) as http:
            run_stream = await http.get(f"{base}/runs/{run_id}", params={"offset": "-1"})
            session_stream = await http.get(
                f"{base}/sessions/{session_id}", params={"offset": "-1"}
            )
            steps_http = await http.get(f"{cp.http_url}/v1/workspaces/{WS}/runs/{run_id}/steps")
        assert run_stream.status_code == session_stream.status_code == 200
        assert steps_http.status_code == 200, steps_http.text

        def proto(kind_payload: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
            return [(k.removeprefix("STEP_KIND_").lower(), json.loads(p)) for k, p in kind_payload]

        def as_json(steps: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
            return [(s["kind"].removeprefix("STEP_KIND_").lower(), s["payload"]) for s in steps]

        doors = {
            "ListRunSteps": proto(by_list),
            "WatchRun": proto(by_watch),
            "ReadStream": as_json(by_grpc_stream),
            "run stream": as_json([v["step"] for v in run_stream.json()]),
            "session stream": as_json([v["step"] for v in session_stream.json()]),
            "GET steps": as_json(steps_http.json()["steps"]),
        }
        for door, seen in doors.items():
            check(seen, whole=role == "operator", door=f"{role} {door}")
        reads[role] = list(doors.values())
        # Every door serves the role the same steps, in the same order.
        assert all(seen == reads[role][0] for seen in reads[role]), role

    reader, operator = reads["reader"][0], reads["operator"][0]
    assert [k for k, _ in reader] == [k for k, _ in operator]  # no step dropped
    for (kind, projected), (_, whole) in zip(reader, operator, strict=True):
        hidden = HIDDEN.get(kind, set())
        assert projected == {k: v for k, v in whole.items() if k not in hidden}, kind
    await api.close()
