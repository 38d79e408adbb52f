"""Floors of size a test keeps: no function over 60 lines in the product's code, the run loop
within a sitting's read, and the durable core (scripts/core_lines.py) within its budget."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("control_plane", "executor", "agentrun_cli", "telemetry", "sandbox", "faults", "ground")
MAX_FUNCTION_LINES = 60
MAX_RUN_LOOP_LINES = 350
MAX_CORE_CODE_LINES = 3500


def long_functions(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every function (or method) over MAX_FUNCTION_LINES lines, as `file:line name (n)`."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_sixty_lines():
    assert long_functions(ROOT) == []


def test_the_check_sees_a_long_method(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"        x = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg" / "m.py").write_text(f"class C:\n    def long(self):\n{body}\n")
    assert long_functions(tmp_path, ("pkg",)) == ["pkg/m.py:2 long (61 lines)"]


def test_the_run_loop_class_reads_in_one_sitting():
    tree = ast.parse((ROOT / "executor" / "run_loop.py").read_text())
    (loop,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunLoop"]
    assert (loop.end_lineno or 0) - loop.lineno + 1 <= MAX_RUN_LOOP_LINES


def test_the_durable_core_stays_within_its_budget():
    spec = importlib.util.spec_from_file_location("core_lines", ROOT / "scripts" / "core_lines.py")
    assert spec is not None and spec.loader is not None
    core_lines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core_lines)
    code = sum(core_lines.count(ROOT / name)[1] for name, _ in core_lines.CORE)
    assert code <= MAX_CORE_CODE_LINES, f"the durable core is {code} lines of code"
