"""agentrun_client stands alone: its declared dependencies are grpcio and protobuf at the
server's pins, it imports nothing of the server, its stubs are `make gen`'s, and it finds the
address and key where the CLI does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agentrun_client import Client, InvalidArgument, Settings
from agentrun_client.errors import from_rpc_error

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "clients" / "python"


def _pins(pyproject: Path) -> dict[str, str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = [re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", d) for d in deps]
    assert all(pins), f"{pyproject}: every dependency is pinned with =="
    return {m.group(1): m.group(2) for m in pins if m}


def test_it_depends_on_grpcio_and_protobuf_only_at_the_servers_versions() -> None:
    client, server = _pins(PACKAGE / "pyproject.toml"), _pins(REPO / "pyproject.toml")
    assert set(client) == {"grpcio", "protobuf"}
    assert client == {name: server[name] for name in client}


def test_it_imports_nothing_of_the_server_isolated_from_the_checkout() -> None:
    # -I: no PYTHONPATH, no current directory; only the package's own directory is added.
    code = (
        f"import sys; sys.path.insert(0, {str(PACKAGE)!r}); import agentrun_client; "
        "c = agentrun_client.Client('127.0.0.1:1', workspace='w', api_key='k'); c.close(); "
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.replace("'", '"')))
    # agentrun.v1 (the protoc stubs) is the package's own; the server's code is not.
    server = {"agentrun_cli", "control_plane", "executor", "sandbox", "telemetry", "ground"}
    assert "agentrun_client" in loaded and not loaded & server


def test_settings_come_from_arguments_then_environment_then_profile_then_the_dev_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("ADDRESS", "WORKSPACE", "API_KEY", "PROFILE", "TLS_CA", "TLS_SERVER_NAME"):
        monkeypatch.delenv(f"AGENTRUN_{var}", raising=False)
    monkeypatch.setenv("AGENTRUN_CONFIG", str(tmp_path / "config.toml"))
    data = tmp_path / "data"
    (data / "run").mkdir(parents=True)
    (data / "run" / "control-plane.port").write_text("127.0.0.1:50999\n")
    (data / "credentials.json").write_text(
        json.dumps({"admin_key": "dev-admin", "approver_key": "dev-approver"})
    )
    monkeypatch.setenv("AGENTRUN_DATA_DIR", str(data))

    dev = Settings.resolve()
    assert (dev.address, dev.workspace, dev.api_key) == ("127.0.0.1:50999", "default", "dev-admin")
    assert "agentrun dev" in dev.address_from
    assert Settings.resolve(role="approver").api_key == "dev-approver"

    (tmp_path / "config.toml").write_text(
        '[profile.default]\naddress = "cp.example:443"\nworkspace = "acme"\napi_key = "prof"\n'
    )
    prof = Settings.resolve()
    assert (prof.address, prof.workspace, prof.api_key) == ("cp.example:443", "acme", "prof")
    # A profile's key is the caller's identity whatever role is asked for.
    assert Settings.resolve(role="approver").api_key == "prof"

    monkeypatch.setenv("AGENTRUN_ADDRESS", "env:1")
    monkeypatch.setenv("AGENTRUN_API_KEY", "env-key")
    env = Settings.resolve()
    assert (env.address, env.api_key, env.address_from) == ("env:1", "env-key", "AGENTRUN_ADDRESS")

    given = Settings.resolve("arg:2", "ws2", "arg-key")
    assert (given.address, given.workspace, given.api_key) == ("arg:2", "ws2", "arg-key")
    assert "arg-key" not in repr(given)  # the key is never printed


def test_a_filter_it_cannot_map_is_refused_before_anything_is_sent() -> None:
    with Client("127.0.0.1:1", workspace="w", api_key="k") as client:
        with pytest.raises(InvalidArgument) as err:
            next(client.list_runs(status="asleep"))
        assert err.value.field == "status" and "waiting" in err.value.message
        with pytest.raises(InvalidArgument) as size:
            client.list_runs_page(page_size=0)
        assert size.value.field == "page_size"


def test_status_codes_map_to_one_hierarchy() -> None:
    import grpc

    class Failed(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode, details: str) -> None:
            self._code, self._details = code, details

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return self._details

    bad = from_rpc_error(Failed(grpc.StatusCode.INVALID_ARGUMENT, "priority: must be between"))
    assert isinstance(bad, InvalidArgument) and bad.field == "priority"
    assert type(from_rpc_error(Failed(grpc.StatusCode.ABORTED, "decided"))).__name__ == "Conflict"
    assert type(from_rpc_error(Failed(grpc.StatusCode.INTERNAL, "x"))).__name__ == "ServerError"
