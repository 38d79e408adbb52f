"""Counts the durable core's lines: `python scripts/core_lines.py` names each file with its
lines and its lines of code, and prints the totals on its last line.

The durable core is what DESIGN.md asks to stay readable in one sitting: the claim, the
lease and its heartbeat, the commit and its fence, replay, the run loop, the dispatcher,
the stream, and the fast path's lease. Features around it are not counted: the commit's
effects, the model's and the tools' turns, the internal tools, the transcript, the
watchers' token relay. Nor is the claim's plpgsql in `store/sql/schema.sql`, which lived
only in migrations when the core was first measured.

"lines" is every line of the file; "code" leaves out blank lines, comment lines and
docstrings (the prose arguments beside the SQL and the protocol's docstrings are most of
the difference).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (the file, what it is)
CORE = (
    ("control_plane/store/sql/lease.sql", "claim, heartbeat, release on break"),
    ("control_plane/store/lease.py", "claim, heartbeat, release on break"),
    ("control_plane/store/sql/steps.sql", "commit and fence"),
    ("control_plane/store/steps.py", "commit and fence"),
    ("control_plane/dispatch/pipeline.py", "commit pipeline"),
    ("control_plane/dispatch/commits.py", "group commit"),
    ("control_plane/dispatch/requests.py", "commit message to request"),
    ("control_plane/dispatch/session.py", "stream, control plane side"),
    ("control_plane/dispatch/slots.py", "a stream's slots"),
    ("control_plane/dispatch/liveness.py", "stream liveness, release on break"),
    ("control_plane/dispatch/dispatcher.py", "dispatcher"),
    ("control_plane/dispatch/fast_path.py", "fast path's lease"),
    ("executor/run_loop.py", "run loop"),
    ("executor/held.py", "run loop: the held run"),
    ("executor/replay.py", "replay"),
    ("executor/stream.py", "stream, executor side"),
    ("executor/lease.py", "lease and heartbeat, executor side"),
    ("executor/horizon.py", "send horizon"),
)


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers of every module, class and function docstring."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = getattr(first, "value", None)
            is_text = isinstance(value, ast.Constant) and isinstance(value.value, str)
            if isinstance(first, ast.Expr) and is_text and first.end_lineno is not None:
                found |= set(range(first.lineno, first.end_lineno + 1))
    return found


def count(path: Path) -> tuple[int, int]:
    """(lines, lines of code) of a Python or SQL file."""
    text = path.read_text()
    lines = text.splitlines()
    comment = "--" if path.suffix == ".sql" else "#"
    docs = _docstring_lines(ast.parse(text)) if path.suffix == ".py" else set()
    code = sum(
        1
        for number, line in enumerate(lines, start=1)
        if line.strip() and not line.strip().startswith(comment) and number not in docs
    )
    return len(lines), code


def main() -> int:
    lines = code = 0
    for name, what in CORE:
        n, c = count(ROOT / name)
        lines, code = lines + n, code + c
        print(f"{n:6d} lines {c:6d} code  {name}  ({what})")
    print(f"{lines:6d} lines {code:6d} code  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
