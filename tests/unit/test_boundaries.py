"""The executor's only link to the control plane is gRPC: it never imports it or asyncpg."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"control_plane", "asyncpg"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_executor_imports_neither_control_plane_nor_postgres():
    files = list((ROOT / "executor").rglob("*.py"))
    assert files
    offenders = {
        str(f.relative_to(ROOT)): sorted(imported_roots(f) & FORBIDDEN)
        for f in files
        if imported_roots(f) & FORBIDDEN
    }
    assert offenders == {}


def test_only_the_store_imports_asyncpg_in_the_control_plane():
    # Beyond the store, asyncpg appears only for pool types and error classes.
    allowed = {"store", "errors.py", "server.py", "dispatch", "api", "approvals"}
    offenders = [
        str(f.relative_to(ROOT))
        for f in (ROOT / "control_plane").rglob("*.py")
        if "asyncpg" in imported_roots(f)
        and f.relative_to(ROOT / "control_plane").parts[0] not in allowed
    ]
    assert offenders == []
