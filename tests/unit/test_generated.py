"""clients/python/agentrun/ is exactly what protoc makes from proto/ (committed, never edited)."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_changes_nothing(tmp_path):
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto").rglob("*.proto"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            "proto",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--mypy_out={tmp_path}",
            f"--mypy_grpc_out={tmp_path}",
            *protos,
        ],
        cwd=ROOT,
        check=True,
        env=env,
        capture_output=True,
    )
    fresh = tmp_path / "agentrun" / "v1"
    committed = ROOT / "clients" / "python" / "agentrun" / "v1"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(
        p.name for p in committed.iterdir() if p.name != "__init__.py" and p.name != "__pycache__"
    )
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert (mismatch, errors) == ([], []), "run `make gen` and commit clients/python/agentrun/"


def test_every_step_kind_has_a_stored_name():
    from agentrun.v1 import run_pb2
    from control_plane.ground import convert

    kinds = {v.number for v in run_pb2.StepKind.DESCRIPTOR.values if v.number}
    assert set(convert.KIND_TO_PROTO.values()) == kinds
