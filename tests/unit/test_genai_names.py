"""The GenAI attribute names we emit are the semantic conventions' (issue 46), metrics' label
values stay bounded, and unary gRPC calls carry trace context from client to server."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as semconv

from control_plane.ops.run_figures import OTHER, Bounded
from telemetry import genai, grpc_trace, tracing


def test_the_attribute_names_are_those_of_the_pinned_semantic_conventions():
    assert genai.OPERATION_NAME == semconv.GEN_AI_OPERATION_NAME
    assert genai.PROVIDER_NAME == semconv.GEN_AI_PROVIDER_NAME
    assert genai.REQUEST_MODEL == semconv.GEN_AI_REQUEST_MODEL
    assert genai.RESPONSE_MODEL == semconv.GEN_AI_RESPONSE_MODEL
    assert genai.RESPONSE_ID == semconv.GEN_AI_RESPONSE_ID
    assert genai.RESPONSE_FINISH_REASONS == semconv.GEN_AI_RESPONSE_FINISH_REASONS
    assert genai.USAGE_INPUT_TOKENS == semconv.GEN_AI_USAGE_INPUT_TOKENS
    assert genai.USAGE_OUTPUT_TOKENS == semconv.GEN_AI_USAGE_OUTPUT_TOKENS
    assert genai.CONVERSATION_ID == semconv.GEN_AI_CONVERSATION_ID
    assert genai.TOOL_NAME == semconv.GEN_AI_TOOL_NAME
    assert genai.TOOL_CALL_ID == semconv.GEN_AI_TOOL_CALL_ID
    assert genai.TOOL_TYPE == semconv.GEN_AI_TOOL_TYPE
    assert semconv.GenAiOperationNameValues.CHAT.value == genai.CHAT
    assert semconv.GenAiOperationNameValues.EXECUTE_TOOL.value == genai.EXECUTE_TOOL
    assert genai.chat_span_name("gpt-4o") == "chat gpt-4o"
    assert genai.tool_span_name("send_email") == "execute_tool send_email"


def test_label_values_past_the_bound_are_counted_as_other():
    agents = Bounded(2)
    assert agents("ws", "a") == "a" and agents("ws", "b") == "b"
    assert agents("ws", "c") == OTHER  # a third pair: folded
    assert agents("ws", "a") == "a"  # one seen before keeps its own
    assert agents("other-ws", "a") == OTHER  # pairs, not names, are bounded


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> TracerProvider:
    """Spans to memory: the interceptors' tracer is this provider's, and tracing is on."""
    provider = TracerProvider()
    monkeypatch.setattr(tracing, "_on", True)
    monkeypatch.setattr(grpc_trace, "_tracer", provider.get_tracer("grpc"))
    return provider


class _Echo(health_pb2_grpc.HealthServicer):
    async def Check(self, request, context):  # noqa: N802 - the service's name
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def test_a_unary_call_carries_the_callers_trace_to_the_servers_span(provider, monkeypatch):
    # Health checks are never traced (polled); here the interceptor is told to trace them,
    # so a real server and channel need no service of our own.
    monkeypatch.setattr(grpc_trace, "_UNTRACED", ())
    server = grpc.aio.server(interceptors=[grpc_trace.ServerTracing()])
    health_pb2_grpc.add_HealthServicer_to_server(_Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    try:
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=grpc_trace.client_interceptors()
        )
        async with channel:
            with tracer.start_as_current_span("caller") as caller:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    finally:
        await server.stop(None)
    served = [s for s in exporter.get_finished_spans() if s.name == "grpc.health.v1.Health/Check"]
    assert len(served) == 2
    joined, alone = served
    assert joined.parent is not None and joined.parent.span_id == caller.get_span_context().span_id
    assert joined.context.trace_id == caller.get_span_context().trace_id
    assert joined.kind == trace.SpanKind.SERVER
    assert alone.parent is None  # no context sent: a request of its own
