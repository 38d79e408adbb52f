"""OpenTelemetry traces: exported over OTLP/HTTP when an endpoint is configured, else off.

With neither `OTEL_EXPORTER_OTLP_ENDPOINT` nor `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set,
`configure()` installs nothing: the API's default tracer hands out non-recording spans,
so the `start_as_current_span` calls in the run loop, the commit handler and the query
runner cost a context switch and nothing more. With one set, spans go through a batch
processor to the OTLP/HTTP exporter, which reads the standard `OTEL_*` variables
(headers, timeout, `OTEL_BSP_SCHEDULE_DELAY`, …).

Trace context crosses the executor stream per message: the stream is long-lived, so
each Commit carries the W3C `traceparent` of the executor's commit span (`current()`),
and the control plane continues it (`context_of()`).

One run, one trace: a run is held many times (after every park, by any executor), and
each hold's root span takes the run's id as its trace id (`run_trace()`), so all of a
run's holds, commits and statements join one trace, found by the run id (without dashes).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import uuid
from collections.abc import Iterator, Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# The trace id a root span started here takes (a run's id), else a random one.
_RUN_TRACE: contextvars.ContextVar[int] = contextvars.ContextVar("agentrun_run_trace", default=0)


@contextlib.contextmanager
def run_trace(run_id: str) -> Iterator[None]:
    """Root spans started inside take `run_id` (a UUID) as their trace id."""
    try:
        trace_id = uuid.UUID(run_id).int
    except ValueError:
        trace_id = 0
    token = _RUN_TRACE.set(trace_id)
    try:
        yield
    finally:
        _RUN_TRACE.reset(token)


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether an OTLP endpoint is configured (and OTEL_SDK_DISABLED is not true)."""
    env = os.environ if env is None else env
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return False
    return any(env.get(name) for name in _ENDPOINT_VARS)


_on = False


def on() -> bool:
    """Whether this process exports spans (hot paths skip even no-op spans otherwise)."""
    return _on


def configure(service: str, env: Mapping[str, str] | None = None) -> bool:
    """Install the SDK's tracer provider exporting to OTLP/HTTP; False (nothing done) when
    no endpoint is configured. Spans still buffered are flushed at exit."""
    if not enabled(env):
        return False
    # Imported only when on: a process without an endpoint never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunTraceIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            return _RUN_TRACE.get() or super().generate_trace_id()

        def is_trace_id_random(self) -> bool:
            return False

    resource = Resource.create({"service.name": service})
    provider = TracerProvider(resource=resource, id_generator=RunTraceIds())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)
    global _on
    _on = True
    return True


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def current() -> str:
    """The current span's `traceparent` header value; "" when no span is recording."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def context_of(traceparent: str) -> Context | None:
    """The remote parent a `traceparent` names (None for an empty or malformed one)."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    span = trace.get_current_span(ctx)
    return ctx if span.get_span_context().is_valid else None


__all__ = ["configure", "context_of", "current", "enabled", "on", "run_trace", "tracer"]
