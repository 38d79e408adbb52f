"""agentrun's processes load grpc with telemetry/grpc_core.py's settings already in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry import grpc_core

ROOT = Path(__file__).resolve().parents[2]

# Records GRPC_EXPERIMENTS and GRPC_ENABLE_FORK_SUPPORT as they are when `grpc` is first
# imported, then imports the module.
PROBE = """
import importlib, json, os, sys

seen = []

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_EXPERIMENTS"))
            seen.append(os.environ.get("GRPC_ENABLE_FORK_SUPPORT"))
        return None

sys.meta_path.insert(0, Spy())
importlib.import_module(sys.argv[1])
print(json.dumps({"loaded": "grpc" in sys.modules, "at_import": seen[:1],
                  "fork_support": seen[1:2]}))
"""


def _probe(module: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k not in (grpc_core.ENV, grpc_core.FORK_ENV)}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]))
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module", ["control_plane.server", "executor.__main__", "agentrun_cli.main", "bench.grpc_floor"]
)
def test_each_entry_point_sets_the_experiments_before_grpc_loads(module: str) -> None:
    assert _probe(module) == {
        "loaded": True,
        "at_import": [grpc_core.EXPERIMENTS],
        "fork_support": ["false"],
    }


def test_an_operators_setting_wins_even_an_empty_one() -> None:
    assert _probe("control_plane.server", GRPC_EXPERIMENTS="")["at_import"] == [""]
    environ = {"GRPC_EXPERIMENTS": "event_engine_client"}
    grpc_core.configure(environ)
    assert environ["GRPC_EXPERIMENTS"] == "event_engine_client"
    assert environ["GRPC_ENABLE_FORK_SUPPORT"] == "false"
    empty: dict[str, str] = {}
    grpc_core.configure(empty)
    assert empty == {"GRPC_EXPERIMENTS": grpc_core.EXPERIMENTS, "GRPC_ENABLE_FORK_SUPPORT": "false"}
    assert _probe("control_plane.server", GRPC_ENABLE_FORK_SUPPORT="true")["fork_support"] == [
        "true"
    ]
