"""Logs and traces shared by the control plane and the executor (neither imports the other).

`telemetry.logs` configures stdlib logging to render through structlog (JSON lines by
default) with the context bound by `telemetry.logs.bound(...)`; `telemetry.tracing`
turns OpenTelemetry on when an OTLP endpoint is configured and carries trace context in
a W3C `traceparent` string.
"""
