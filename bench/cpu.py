"""CPU accounting for a phase: which processes used the machine's cores, from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from agentrun_cli.devstack import child_pids

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (0 when it is gone or not on Linux)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = _stat(pid)
        return (int(fields[11]) + int(fields[12])) / TICK
    return 0.0


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process, its children that exited (reaped) and its live children:
    a Postgres server with its backends, which come and go with their connections."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = _stat(pid)
        own = sum(int(v) for v in fields[11:15]) / TICK
        return own + sum(map(process_cpu, child_pids(pid)))
    return 0.0


def machine_busy() -> float:
    """Busy CPU seconds of all cores since boot (everything but idle and iowait)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (sum(values) - values[3] - values[4]) / TICK
    return 0.0


class CpuMeter:
    """CPU seconds used by groups of processes between construction and `used()`.

    `trees`: groups measured with their children (tree_cpu), e.g. the Postgres server."""

    def __init__(
        self, groups: dict[str, list[int]], rest: str, trees: dict[str, int] | None = None
    ) -> None:
        self._groups = groups
        self._trees = trees or {}
        self._rest = rest
        self._start = self._read()
        self._end: dict[str, float] | None = None

    def _read(self) -> dict[str, float]:
        used = {name: sum(map(process_cpu, pids)) for name, pids in self._groups.items()}
        used |= {name: tree_cpu(pid) for name, pid in self._trees.items()}
        return {**used, "_machine": machine_busy(), "_wall": time.perf_counter()}

    def stop(self) -> dict[str, float]:
        """Freeze the figures now; CPU seconds of each group since construction."""
        self._end = self._read()
        return self.used()

    def used(self) -> dict[str, float]:
        end = self._end or self._read()
        return {k: end[k] - self._start[k] for k in end if not k.startswith("_")}

    def summary(self) -> str:
        """e.g. `CPU s: executors 12.1, rest 8.0; machine 96% busy of 2 cores`."""
        end = self._end or self._read()
        delta = {k: end[k] - self._start[k] for k in end}
        wall, machine = delta.pop("_wall"), delta.pop("_machine")
        parts = [f"{name} {seconds:.1f}" for name, seconds in delta.items()]
        parts.append(f"{self._rest} {machine - sum(delta.values()):.1f}")
        cores = os.cpu_count() or 1
        busy = 100 * machine / (wall * cores) if wall else 0.0
        return f"CPU s: {', '.join(parts)}; machine {busy:.0f}% busy of {cores} cores"
