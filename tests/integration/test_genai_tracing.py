"""Traces as agent-observability tools read them (issue 46): model and tool spans of the
OpenTelemetry GenAI conventions with the step log's token counts, unary calls joined to
their caller's trace, and idle processes that export no root span.

Real processes export over OTLP/HTTP to the decoding receiver of test_tracing.py.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api
from tests.harness.waiting import eventually
from tests.integration.test_tracing import OtlpReceiver, Span, _otel_env

IDLE_SECONDS = 10


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


async def test_model_and_tool_spans_carry_the_genai_attributes_of_the_step_log(
    db_url, control_plane, executor_factory, otlp: OtlpReceiver
):
    cp = control_plane(db_url, **_otel_env(otlp))
    api = await Api.connect(cp.address, db_url)
    try:
        # One decision with two echo calls, then the answer: two model and two tool calls.
        await api.publish("echoer", "two_echoes", ["echo"])
        run_id = await api.start("echoer")
        executor_factory(cp, **_otel_env(otlp))
        (run,) = await api.wait_terminal([run_id], within=30)
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        steps = await api.steps(run_id)
        # A unary call made inside a trace of the caller's joins it (the traceparent).
        trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
        await api.runs.GetRun(
            run_pb2.GetRunRequest(workspace_id=api.ws, run_id=run_id),
            metadata=(("traceparent", f"00-{trace_id}-{parent_id}-01"),),
        )
    finally:
        await api.close()
    decisions = [s for s in steps if s.kind == "model_decision"]
    started = [s for s in steps if s.kind == "tool_started"]
    assert len(decisions) == 2 and len(started) == 2

    def whole() -> list[Span]:
        spans = otlp.of_trace(run_id.replace("-", ""))
        assert len([s for s in spans if s.name.startswith("chat ")]) == len(decisions)
        assert len([s for s in spans if s.name.startswith("execute_tool ")]) == len(started)
        return spans

    spans = await eventually(whole, timeout=15, message="the run's GenAI spans never arrived")
    chats = {s.attributes["agentrun.seq"]: s for s in spans if s.name.startswith("chat ")}
    for step in decisions:
        chat = chats[step.seq]
        usage = step.payload["usage"]
        assert chat.name == "chat two_echoes"
        assert chat.service == "agentrun-executor"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.request.model"] == "two_echoes"
        assert chat.attributes["gen_ai.response.model"] == step.payload["model"]
        assert chat.attributes["gen_ai.response.id"] == step.payload["response_id"]
        assert chat.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert chat.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert chat.attributes["gen_ai.conversation.id"] == run_id
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    tools = {
        s.attributes["gen_ai.tool.call.id"]: s for s in spans if "gen_ai.tool.name" in s.attributes
    }
    assert set(tools) == {s.payload["call_id"] for s in started}
    for step in started:
        tool = tools[step.payload["call_id"]]
        assert tool.name == "execute_tool echo"
        assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool.attributes["gen_ai.tool.name"] == "echo"
        assert tool.attributes["agentrun.seq"] == step.seq
    # Model and tool calls sit in the run's hold, as its commits do.
    holds = {s.span_id for s in spans if s.name == "agentrun.run"}
    assert {s.parent_id for s in [*chats.values(), *tools.values()]} <= holds

    def joined() -> Span:
        served = [s for s in otlp.of_trace(trace_id) if s.name == "agentrun.v1.RunService/GetRun"]
        assert len(served) == 1
        return served[0]

    served = await eventually(joined, timeout=10, message="GetRun's span never joined the trace")
    assert served.parent_id == parent_id and served.service == "agentrun-control-plane"
    assert served.attributes["rpc.system"] == "grpc"
    statements = [s for s in otlp.of_trace(trace_id) if s.parent_id == served.span_id]
    assert statements and all(s.attributes["db.system.name"] == "postgresql" for s in statements)


async def test_idle_processes_export_no_root_span(
    db_url, control_plane, executor_factory, otlp: OtlpReceiver
):
    """A control plane and an executor with nothing to do: their polling loops (the claim,
    the sweeps, the relays, the scheduler, heartbeats) trace nothing for IDLE_SECONDS."""
    cp = control_plane(db_url, AGENTRUN_RELEASE_GATE="off", **_otel_env(otlp))
    api = await Api.connect(cp.address, db_url)
    try:
        await api.publish("echoer", "two_echoes", ["echo"])
        run_id = await api.start("echoer")
        executor_factory(cp, **_otel_env(otlp))
        await api.wait_terminal([run_id], within=30)
    finally:
        await api.close()
    # The exporters send every 100 ms: what the run and the calls above made has arrived
    # once the run's spans have.
    await eventually(
        lambda: any(s.name == "agentrun.run" for s in otlp.of_trace(run_id.replace("-", ""))),
        timeout=10,
    )
    await asyncio.sleep(1)
    before = len(otlp.spans)
    await asyncio.sleep(IDLE_SECONDS)  # idle, on purpose: what is measured is this quiet
    after = otlp.spans[before:]
    roots = [f"{s.service}: {s.name}" for s in after if s.parent_id == ""]
    assert roots == [], roots
    assert after == [], [f"{s.service}: {s.name}" for s in after]
