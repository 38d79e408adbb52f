"""`agentrun dev --agents DIR --scenarios DIR`: a user's own agent, tool and scenarios are
applied at start and again on every change, the next run uses the new version without a
restart, a bad file is reported and the loop carries on; with a provider's key and base URL
in the environment, the stack's agents call that model server instead of its sandbox."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentrun_cli.devstack import EmbeddedRedis
from tests.harness.agentrun_dev import DevProcess, running_dev
from tests.harness.processes import ProcessGroup, python_module
from tests.harness.servers import scratch_dir

ANSWER = {"forecast": "sunny, 21 C"}


class _Weather(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        body = json.dumps({**ANSWER, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def weather_url() -> Iterator[str]:
    """The user's own HTTP tool: a few lines of http.server, on a free port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Weather)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/weather"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tmp() -> Iterator[Path]:
    with scratch_dir("agentrun-dev-loop-") as path:
        yield path


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _run(dev: DevProcess, agent: str) -> str:
    done = dev.cli("runs", "start", agent, "--input", "weather?", "--watch", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "status: completed" in done.stdout, done.stdout
    return done.stdout


def test_the_loop_applies_at_start_reloads_on_change_and_survives_bad_files(
    tmp: Path, db_url: str, redis_server: EmbeddedRedis, weather_url: str
) -> None:
    agents, scenarios = tmp / "agents", tmp / "scenarios"
    agents.mkdir()
    scenarios.mkdir()
    _write(
        agents / "weather.yaml",
        "name: weather\naccess: read\ndescription: Today's weather in a city.\n"
        "parameters: {type: object, properties: {city: {type: string}}, required: [city]}\n"
        f'http: {{method: GET, url: "{weather_url}", query: {{city: "{{city}}"}}}}\n',
    )
    forecaster = agents / "forecaster.yaml"
    _write(
        forecaster, "agent: forecaster\nmodel: weather\ninstructions: Say it.\ntools: [weather]\n"
    )
    call = {"tool_calls": [{"name": "weather", "arguments": {"city": "Lisbon"}}]}
    _write(
        scenarios / "weather.json",
        json.dumps({"turns": [call, {"content": "Lisbon: {{last_tool_result}}"}]}),
    )
    _write(scenarios / "brief.json", json.dumps({"turns": [call, {"content": "Brief: sunny"}]}))

    with running_dev(
        tmp / "data",
        "--address",
        "127.0.0.1:0",
        "--agents",
        str(agents),
        "--scenarios",
        str(scenarios),
        DATABASE_URL=db_url,
        REDIS_URL=redis_server.url,
    ) as dev:
        # Applied before the stack says it is up: the tool, the agent, the scenarios.
        out = dev.output()
        assert "weather.yaml: saved tool weather v1" in out, out
        assert "forecaster.yaml: published forecaster v1" in out, out
        assert "weather.json: scenario weather ready" in out, out
        first = _run(dev, "forecaster")
        assert "sunny, 21 C" in first and "city=Lisbon" in first, first  # the user's server

        # An edit publishes v2 while the stack runs; the next run is v2's.
        _write(forecaster, forecaster.read_text().replace("model: weather", "model: brief"))
        dev.wait_line("forecaster.yaml: published forecaster v2")
        second = _run(dev, "forecaster")
        assert "Brief: sunny" in second, second
        shown = dev.cli("runs", "list", "-o", "json")
        assert shown.returncode == 0, shown.stderr

        # A broken agent file and a broken scenario are reported, naming the file; nothing
        # else is published (the unchanged agent stays at v2) and the loop carries on.
        _write(agents / "broken.yaml", "agent: broken\nmodel: weather\nmax_step: 3\n")
        line = dev.wait_line("error: ")
        assert "broken.yaml" in line and "max_step" in line, line
        _write(scenarios / "bad.json", '{"turns": [')
        line = dev.wait_line("error: ")
        assert "bad.json" in line and "invalid JSON" in line, line
        _write(forecaster, forecaster.read_text().replace("Say it.", "Say it briefly."))
        dev.wait_line("forecaster.yaml: published forecaster v3")
        assert "published forecaster v3" not in "\n".join(dev.lines[:-1])
        assert "published forecaster v2" in dev.output()

        # A new version of the tool needs a new version of the agents that use it.
        tool = agents / "weather.yaml"
        _write(tool, tool.read_text().replace("in a city.", "in any city."))
        dev.wait_line("weather.yaml: saved tool weather v2")
        dev.wait_line("forecaster.yaml: published forecaster v4")
        assert "Traceback" not in dev.output()


def test_a_provider_key_and_base_url_send_the_stacks_agents_to_that_model_server(
    tmp: Path, db_url: str, redis_server: EmbeddedRedis
) -> None:
    # The "real" provider: the sandbox's OpenAI-compatible server, wanting a key, playing a
    # scenario that only it has (the stack's own sandbox would answer 404 for the model).
    outside = tmp / "outside"
    outside.mkdir()
    _write(outside / "outside_only.json", json.dumps({"turns": [{"content": "from outside"}]}))
    group = ProcessGroup(tmp)
    argv = python_module("sandbox", "model", "--port", "0", "--api-key", "sk-test-key")
    process = group.new("outside-model", argv + ["--scenarios", str(outside)], {}, port_file=True)
    process.argv += ["--port-file", str(process.port_file)]
    try:
        model = process.start().wait_ready()
        url = f"http://127.0.0.1:{model.port}"
        agents = tmp / "agents"
        agents.mkdir()
        _write(agents / "plain.yaml", "agent: plain\nmodel: outside_only\ninstructions: Hi.\n")
        with running_dev(
            tmp / "data",
            "--address",
            "127.0.0.1:0",
            "--agents",
            str(agents),
            DATABASE_URL=db_url,
            REDIS_URL=redis_server.url,
            OPENAI_API_KEY="sk-test-key",
            OPENAI_BASE_URL=f"{url}/v1",
        ) as dev:
            assert f"{url}/v1 (OPENAI_API_KEY, profile openai)" in dev.output()
            assert "from outside" in _run(dev, "plain")
            seen = httpx.get(f"{url}/_sandbox/requests", timeout=5).json()["requests"]
            assert [r["model"] for r in seen if "model" in r] == ["outside_only"]
            assert "sk-test-key" not in dev.output()
    finally:
        group.kill_all()
