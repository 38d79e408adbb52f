"""Structured logs: existing stdlib calls become JSON lines carrying the bound run context."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from telemetry import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """Configure logging into a buffer; the root logger is put back afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    out = io.StringIO()
    yield out
    root.handlers[:], root.level = saved
    structlog.reset_defaults()


def lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("raw", ["debug", "DEBUG", "Debug", " debug "])
def test_the_level_is_read_in_any_case(raw):
    assert logs.level_from_env({"AGENTRUN_LOG_LEVEL": raw}) == logging.DEBUG


def test_an_unknown_level_names_the_choices():
    with pytest.raises(SystemExit, match="debug, info, warning, error"):
        logs.level_from_env({"AGENTRUN_LOG_LEVEL": "loud"})


def test_stdlib_calls_become_json_with_the_bound_context(stream):
    logs.configure("executor", env={"AGENTRUN_LOG_LEVEL": "info"}, stream=stream)
    log = logging.getLogger("executor.run_loop")
    with logs.bound(workspace="acme", run="r-1", epoch=3):
        log.info("run %s parked (%s)", "r-1", "sleep")
    log.debug("not at info")
    log.warning("outside a run")
    first, second = lines(stream)
    assert first["message"] == "run r-1 parked (sleep)"
    assert (first["workspace"], first["run"], first["epoch"]) == ("acme", "r-1", 3)
    assert (first["level"], first["logger"], first["service"]) == (
        "info",
        "executor.run_loop",
        "executor",
    )
    assert "timestamp" in first
    assert second["level"] == "warning" and "run" not in second


def test_an_exception_is_one_line_with_its_traceback(stream):
    logs.configure("control-plane", env={}, stream=stream)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("x").exception("commit failed")
    (line,) = lines(stream)
    assert line["message"] == "commit failed"
    assert "Traceback" in line["exception"] and "ValueError: boom" in line["exception"]


def test_an_extra_processor_adds_the_callers_context(stream):
    def request_id(logger, method, event):
        event["request_id"] = "req-7"
        return event

    logs.configure("control-plane", extra=[request_id], env={}, stream=stream)
    logging.getLogger("y").info("hello")
    assert lines(stream)[0]["request_id"] == "req-7"
