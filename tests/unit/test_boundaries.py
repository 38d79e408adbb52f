"""Import boundaries: the executor never imports the control plane or asyncpg, and inside the
control plane only the store imports asyncpg; the control plane imports no executor module
(what both sides use lives in ground/); the control plane's floors (control_plane/store,
control_plane/ground) import none of its domain packages; and no first-party modules import
each other in a circle.

The checks read every import statement of a file, also those inside functions (deferred) and
under `if TYPE_CHECKING:`: the interpreter and ruff never see the circles those close, but a
reader still has to hold both modules in mind at once. Each check reads any tree (`root`), so
each is also shown failing on code planted in a temporary one.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"control_plane", "asyncpg"}
# Our own packages: an import of anything else (stdlib, third party, the generated protos
# under `agentrun`) is no edge of the graph.
FIRST_PARTY = (
    "control_plane",
    "executor",
    "agentrun_cli",
    "telemetry",
    "sandbox",
    "faults",
    "ground",
    "bench",
    "scripts",
)
# What the control plane's domain packages stand on; they import none of those packages.
FLOORS = ("control_plane.store", "control_plane.ground")


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


# --- the import graph of a tree -------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """One import statement naming a first-party module: who imports what, and where."""

    importer: str
    imported: str
    path: str  # relative to the tree's root
    line: int
    how: str  # "" at import time, "in a function" (deferred) or "if TYPE_CHECKING"
    statement: str

    def __str__(self) -> str:
        how = f" [{self.how}]" if self.how else ""
        return f"{self.path}:{self.line}{how}  {self.statement}"


class _ImportStatements(ast.NodeVisitor):
    """The import statements of one file, each with how it is reached."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
        self._how: list[str] = []

    def _visit_under(self, how: str, nodes: Iterable[ast.AST]) -> None:
        self._how.append(how)
        for node in nodes:
            self.visit(node)
        self._how.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._visit_under("in a function", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self._visit_under("if TYPE_CHECKING", node.body)
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self._how[-1] if self._how else ""))

    visit_ImportFrom = visit_Import


def module_files(root: Path, packages: Iterable[str] = FIRST_PARTY) -> dict[str, Path]:
    """Every module of the packages present under `root`, by dotted name (a package's
    __init__.py by the package's name)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module `name` is or lies in (its longest prefix that is a module), if first-party."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(
    node: ast.Import | ast.ImportFrom, importer: str, modules: Mapping[str, Path]
) -> set[str]:
    """The first-party modules one statement imports: `import a.b` names a.b; `from pkg
    import name` names pkg.name when that is a module, else pkg; relative ones count too."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        package = importer.split(".")
        if modules[importer].name != "__init__.py":
            package = package[:-1]
        base = package[: len(package) - node.level + 1] if node.level else []
        source = ".".join([*base, *([node.module] if node.module else [])])
        names = [f"{source}.{alias.name}" for alias in node.names]
    return {found for name in names if (found := _known(name, modules))}


@functools.cache
def edges(root: Path, packages: tuple[str, ...] = FIRST_PARTY) -> tuple[Edge, ...]:
    """Every import of one first-party module by another, anywhere in its file."""
    modules = module_files(root, packages)
    found = []
    for importer, path in modules.items():
        statements = _ImportStatements()
        statements.visit(ast.parse(path.read_text(), str(path)))
        where = str(path.relative_to(root))
        for node, how in statements.found:
            for imported in sorted(_imported(node, importer, modules) - {importer}):
                edge = Edge(importer, imported, where, node.lineno, how, ast.unparse(node))
                found.append(edge)
    return tuple(found)


def _within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# --- circles --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Circle:
    """Modules that import each other, the shortest way round through the first, and every
    import statement among them (those are what close it)."""

    modules: tuple[str, ...]
    way_round: tuple[str, ...]
    imports: tuple[Edge, ...]

    def __str__(self) -> str:
        among = f" among {len(self.modules)} modules" if len(self.modules) > 2 else ""
        lines = [f"import circle{among}: {' -> '.join(self.way_round)}"]
        if len(self.modules) > len(self.way_round) - 1:
            lines.append(f"  modules: {', '.join(self.modules)}")
        lines += [f"  {edge}" for edge in self.imports]
        return "\n".join(lines)


def _reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for found in graph.get(todo.pop(), set()) - seen:
            seen.add(found)
            todo.append(found)
    return seen


def _way_round(graph: Mapping[str, set[str]], start: str, members: set[str]) -> tuple[str, ...]:
    """The shortest path from `start` back to it inside `members` (breadth first)."""
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for found in sorted(graph[node] & members):
            if found == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return (*reversed(path), start)
            if found not in came_from:
                came_from[found] = node
                todo.append(found)
    raise AssertionError(f"{start} is in no circle")


def circles(root: Path, packages: tuple[str, ...] = FIRST_PARTY) -> list[Circle]:
    """The graph's circles: its strongly connected components of more than one module (found
    by reachability, which a graph of a few hundred modules affords)."""
    graph: dict[str, set[str]] = {}
    for edge in edges(root, packages):
        graph.setdefault(edge.importer, set()).add(edge.imported)
    reach = {module: _reachable(graph, module) for module in graph}
    found: list[Circle] = []
    placed: set[str] = set()
    for module in sorted(graph):
        if module in placed or module not in reach[module]:
            continue
        members = {module} | {m for m in reach[module] if module in reach.get(m, set())}
        placed |= members
        closing = (e for e in edges(root, packages) if {e.importer, e.imported} <= members)
        way = _way_round(graph, module, members)
        found.append(Circle(tuple(sorted(members)), way, tuple(closing)))
    return found


def executor_imports_of_the_control_plane(root: Path) -> list[Edge]:
    return [
        e
        for e in edges(root)
        if _within(e.importer, "control_plane") and _within(e.imported, "executor")
    ]


def domain_imports_of_the_floors(root: Path) -> list[Edge]:
    """Imports by control_plane/store or control_plane/ground of any other control-plane
    package: the domain builds on the floors, never the other way round."""
    return [
        e
        for e in edges(root)
        if _within(e.importer, *FLOORS)
        and _within(e.imported, "control_plane")
        and not _within(e.imported, *FLOORS)
    ]


def _fail_listing(what: str, found: Iterable[object]) -> None:
    listed = "\n\n".join(str(item) for item in found)
    if listed:
        pytest.fail(f"{what}:\n\n{listed}", pytrace=False)


# --- the boundaries -------------------------------------------------------------------------


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


def test_the_control_plane_imports_no_executor_module():
    """What both sides need (ground/netguard.py) lives in the top-level ground package."""
    assert edges(ROOT), "the import graph is empty: wrong root?"
    _fail_listing(
        "control-plane imports of executor code", executor_imports_of_the_control_plane(ROOT)
    )


def test_the_store_and_ground_import_no_domain_package():
    _fail_listing(
        "control_plane/store and control_plane/ground import domain packages",
        domain_imports_of_the_floors(ROOT),
    )


def test_no_import_circle_among_first_party_modules():
    _fail_listing("import circles (move a name where it belongs, or split a module)", circles(ROOT))


# --- the checks, shown failing on planted code ----------------------------------------------


def test_the_boundary_check_sees_an_import_inside_a_function(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f():\n    import asyncpg.pool\n")
    assert "asyncpg" in imported_roots(sneaky)


def plant(root: Path, files: Mapping[str, str]) -> Path:
    """Write `files` (path: source) under `root`, with an __init__.py in every package."""
    for name, source in files.items():
        path = root / name
        for folder in reversed(path.relative_to(root).parents[:-1]):
            (root / folder).mkdir(exist_ok=True)
            (root / folder / "__init__.py").touch()
        path.write_text(source)
    return root


def test_a_circle_closed_by_a_deferred_import_is_reported(tmp_path):
    plant(
        tmp_path,
        {
            "app/a.py": "from app import b\n",
            "app/b.py": "def later():\n    from app.a import thing\n",
            "app/c.py": "from app import a, b\n",  # imports both, in no circle
        },
    )
    (found,) = circles(tmp_path, ("app",))
    assert found.modules == ("app.a", "app.b")
    assert found.way_round == ("app.a", "app.b", "app.a")
    report = str(found)
    assert "app/a.py:1  from app import b" in report
    assert "app/b.py:2 [in a function]  from app.a import thing" in report


def test_a_circle_closed_by_a_type_checking_import_is_reported(tmp_path):
    plant(
        tmp_path,
        {
            "app/a.py": "from app.b import B\n",
            "app/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from app.a import A\n"
                "class B: ...\n"
            ),
        },
    )
    (found,) = circles(tmp_path, ("app",))
    assert "app/b.py:3 [if TYPE_CHECKING]  from app.a import A" in str(found)


def test_a_circle_through_several_modules_and_a_relative_import_is_one(tmp_path):
    plant(
        tmp_path,
        {
            "app/a.py": "import app.b\n",
            "app/b.py": "from .c import x\n",
            "app/c.py": "from . import a\n",
            "app/d.py": "from app import a\n",
        },
    )
    (found,) = circles(tmp_path, ("app",))
    assert found.modules == ("app.a", "app.b", "app.c")
    assert found.way_round == ("app.a", "app.b", "app.c", "app.a")
    assert len(found.imports) == 3


def test_from_a_package_import_a_name_is_an_import_of_the_package(tmp_path):
    """`from pkg import name` is the module pkg.name when there is one, else pkg itself."""
    plant(
        tmp_path,
        {
            "app/__init__.py": "VERSION = 1\n",
            "app/a.py": "from app import VERSION, b\n",
            "app/b.py": "",
        },
    )
    assert {(e.importer, e.imported) for e in edges(tmp_path, ("app",))} == {
        ("app.a", "app"),
        ("app.a", "app.b"),
    }


def test_the_executor_check_sees_a_deferred_import(tmp_path):
    plant(
        tmp_path,
        {
            "control_plane/api/runs.py": "def f():\n    from executor.tools import catalogue\n",
            "executor/tools/catalogue.py": "",
        },
    )
    (found,) = executor_imports_of_the_control_plane(tmp_path)
    assert (found.importer, found.imported) == (
        "control_plane.api.runs",
        "executor.tools.catalogue",
    )


def test_the_floor_check_sees_a_domain_import_and_allows_the_floors(tmp_path):
    plant(
        tmp_path,
        {
            "control_plane/store/steps.py": (
                "from control_plane.ground import errors\n"
                "from control_plane.store import db\n"
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from control_plane.credits.pricing import Usage\n"
            ),
            "control_plane/store/db.py": "",
            "control_plane/ground/errors.py": "import control_plane.api.runs\n",
            "control_plane/credits/pricing.py": "from control_plane.store import steps\n",
            "control_plane/api/runs.py": "",
        },
    )
    found = domain_imports_of_the_floors(tmp_path)
    assert [(e.importer, e.imported) for e in found] == [
        ("control_plane.ground.errors", "control_plane.api.runs"),
        ("control_plane.store.steps", "control_plane.credits.pricing"),
    ]
