"""Counts the durable core's lines: `python scripts/core_lines.py` names each file and its
lines, and prints the total on its last line.

The durable core is what DESIGN.md asks to stay readable in one sitting: the claim, the
lease and its heartbeat, the commit and its fence, replay, the run loop, the dispatcher,
the stream, and the fast path's lease. Features around it (effects, internal tools, the
model and tool turns, the watchers' token relay) are not counted. Every line of a file
counts: code, comments, docstrings and blank lines alike.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (what it is, the file)
CORE = (
    ("claim, heartbeat, release on break", "control_plane/store/sql/lease.sql"),
    ("claim, heartbeat, release on break", "control_plane/store/lease.py"),
    ("commit and fence", "control_plane/store/sql/steps.sql"),
    ("commit and fence", "control_plane/store/steps.py"),
    ("commit pipeline and groups", "control_plane/dispatch/commits.py"),
    ("stream, control plane side", "control_plane/dispatch/session.py"),
    ("stream liveness, release on break", "control_plane/dispatch/liveness.py"),
    ("dispatcher", "control_plane/dispatch/dispatcher.py"),
    ("fast path's lease", "control_plane/dispatch/fast_path.py"),
    ("run loop", "executor/run_loop.py"),
    ("replay", "executor/replay.py"),
    ("stream, executor side", "executor/stream.py"),
    ("lease and heartbeat, executor side", "executor/lease.py"),
    ("send horizon", "executor/horizon.py"),
)


def count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def main() -> int:
    total = 0
    for what, name in CORE:
        lines = count(ROOT / name)
        total += lines
        print(f"{lines:6d}  {name}  ({what})")
    print(f"{total:6d}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
