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


def asyncpg_names(path: Path) -> set[str]:
    """The attributes a module uses from asyncpg (asyncpg.X)."""
    tree = ast.parse(path.read_text(), str(path))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "asyncpg"
    }


def test_only_the_store_talks_to_postgres():
    """Outside store/, asyncpg appears only for types and error classes, never to connect."""
    types_and_errors = {
        "pool", "Pool", "Record", "Connection", "PostgresError", "DataError",
        "UniqueViolationError", "exceptions",
    }  # fmt: skip
    offenders = {
        str(f.relative_to(ROOT)): sorted(asyncpg_names(f) - types_and_errors)
        for f in (ROOT / "control_plane").rglob("*.py")
        if f.relative_to(ROOT / "control_plane").parts[0] != "store"
        and asyncpg_names(f) - types_and_errors
    }
    assert offenders == {}
