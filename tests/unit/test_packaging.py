"""A non-editable install (`pip install .`) ships exactly the packages pyproject lists."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("agentrun_cli", "control_plane", "executor", "faults", "sandbox", "telemetry")


def test_every_python_package_of_the_product_is_listed_for_installation():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in SHIPPED
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found - listed == set(), "packages missing from [tool.setuptools] packages"
