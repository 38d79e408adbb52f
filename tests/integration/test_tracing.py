"""Traces and structured logs of real processes: one run, one trace, executor and control plane
joined per commit, down to the SQL statements.

The executor and the control plane export over OTLP/HTTP to a small receiver in this test
(it decodes the protobuf export requests, as a collector would), so the whole path is the
shipped one: the SDK, the batch processor, the exporter, the `traceparent` in each Commit.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from agentrun.v1 import run_pb2
from telemetry import tracing
from tests.harness.agentrun_api import Api
from tests.harness.waiting import eventually

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]


def _value(any_value) -> object:
    which = any_value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, which) if which else None


class OtlpReceiver:
    """`POST /v1/traces` (OTLP/HTTP protobuf): keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server convention
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                receiver._keep(request)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _keep(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                with self._lock:
                    self.spans += [
                        Span(
                            str(attrs.get("service.name")),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in s.attributes},
                        )
                        for s in scope.spans
                    ]

    def of_trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def _otel_env(otlp: OtlpReceiver) -> dict[str, str]:
    # Export often, so the test waits for a fraction of a second rather than 5 s.
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


async def test_one_run_is_one_trace_with_a_span_per_step_joined_across_processes(
    db_url, control_plane, executor_factory, otlp
):
    cp = control_plane(db_url, **_otel_env(otlp))
    api = await Api.connect(cp.address, db_url)
    try:
        # Sleep (a park: two holds of the run), echo, then answer.
        await api.publish("sleeper", "sleepy", ["sleep", "echo"])
        run_id = await api.start("sleeper")
        (executor,) = executor_factory(cp, **_otel_env(otlp))
        (run,) = await api.wait_terminal([run_id], within=30)
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        steps = await api.steps(run_id)
    finally:
        await api.close()
    trace_id = run_id.replace("-", "")  # a run's trace id is its id
    written = [s.seq for s in steps if s.kind != "input"]  # the executor wrote every other step

    def whole() -> list[Span]:
        spans = otlp.of_trace(trace_id)
        assert (
            sorted(s.attributes["agentrun.seq"] for s in spans if s.name.startswith("step "))
            == written
        )
        assert len([s for s in spans if s.name == "agentrun.commit.apply"]) == len(
            [s for s in spans if s.name == "agentrun.commit"]
        )
        return spans

    spans = await eventually(whole, timeout=15, message="the run's spans never all arrived")
    by_id = {s.span_id: s for s in spans}
    step_spans = [s for s in spans if s.name.startswith("step ")]
    # One span per step, named by its kind, each inside the executor's commit that landed it.
    kinds = {s.seq: s.kind for s in steps}
    assert Counter(s.attributes["agentrun.seq"] for s in step_spans) == Counter(written)
    for span in step_spans:
        assert span.name == f"step {kinds[span.attributes['agentrun.seq']]}"
        commit = by_id[span.parent_id]
        assert (commit.service, commit.name) == ("agentrun-executor", "agentrun.commit")
        assert span.attributes["agentrun.seq"] in commit.attributes["agentrun.steps.seq"]
    # Every executor commit is continued by the control plane, which wraps its SQL.
    commits = [s for s in spans if s.name == "agentrun.commit"]
    for commit in commits:
        (applied,) = [
            s for s in spans if s.parent_id == commit.span_id and s.name == "agentrun.commit.apply"
        ]
        assert applied.service == "agentrun-control-plane"
        assert applied.attributes["agentrun.run"] == run_id
        sql = [s for s in spans if s.parent_id == applied.span_id]
        assert sql and all(s.attributes["db.system.name"] == "postgresql" for s in sql)
        assert all(s.service == "agentrun-control-plane" for s in sql)
    # The run was held twice (before and after its sleep): two roots, one trace.
    holds = [s for s in spans if s.name == "agentrun.run"]
    assert len(holds) == 2 and all(s.parent_id == "" for s in holds)
    assert {by_id[c.parent_id].name for c in commits} <= {"agentrun.run"}
    assert {s.attributes["agentrun.epoch"] for s in holds} == {1, 2}

    # The executor's log lines are JSON objects naming the run, its workspace and epoch,
    # and joined to the trace.
    lines = [
        json.loads(line)
        for line in executor.log_path.read_text().splitlines()
        if line.startswith("{")
    ]
    about_run = [line for line in lines if line.get("run") == run_id]
    assert about_run, "no log line carries the run"
    assert all(line["workspace"] == api.ws and line["epoch"] in (1, 2) for line in about_run)
    assert {line["trace_id"] for line in about_run if "trace_id" in line} == {trace_id}
    assert {line["level"] for line in lines} <= {"debug", "info", "warning", "error", "critical"}


def test_without_an_endpoint_nothing_is_traced_and_commits_carry_no_context():
    """No OTLP endpoint: the tracer is the API's no-op one, and no traceparent is made."""
    assert not tracing.enabled({})
    assert not tracing.configure("test", {})
    with tracing.run_trace("0b7f6f7e-3a4c-4c1d-9b0e-2a0c7e1f2d3c"):
        span = tracing.tracer("test").start_span("x")
        assert not span.is_recording()
        assert tracing.current() == ""
