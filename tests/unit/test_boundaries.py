"""Import boundaries: the executor never imports the control plane or asyncpg, and inside the
control plane only the store imports asyncpg."""

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


def test_only_the_store_talks_to_postgres():
    """Outside control_plane/store no module imports asyncpg, not even for a type or an
    error class: the store's edge gives them Pool/Connection/Record and transaction()
    (store/db.py) and translates or classifies driver errors (store/errors.py)."""
    offenders = sorted(
        str(f.relative_to(ROOT))
        for f in (ROOT / "control_plane").rglob("*.py")
        if f.relative_to(ROOT / "control_plane").parts[0] != "store"
        and "asyncpg" in imported_roots(f)
    )
    assert offenders == []


def test_the_boundary_check_sees_an_import_inside_a_function(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f():\n    import asyncpg.pool\n")
    assert "asyncpg" in imported_roots(sneaky)
