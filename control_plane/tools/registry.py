"""The publish-time tool check: known tools, tools some connected pool can run."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.errors import InvalidArgument

# The catalogue shipped with the executor, unless AGENTRUN_CATALOGUE names another.
SHIPPED_CATALOGUE = Path(__file__).resolve().parents[2] / "executor" / "tools" / "catalogue.json"
# An executor row counts as connected for this many lease durations after it was last seen.
LIVE_LEASES = 3.0


@dataclass(frozen=True)
class PublishWarning:
    code: str
    message: str
    tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCheck:
    """A tool set that passed: each tool's capabilities, and what the publisher should know."""

    capabilities: Mapping[str, frozenset[str]]
    warnings: tuple[PublishWarning, ...] = ()


@dataclass(frozen=True)
class Pool:
    """One connected executor and the tools it declared (name -> capabilities)."""

    executor_id: str
    tools: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def from_declared(cls, executor_id: str, declared: Sequence[Mapping[str, Any]]) -> Pool:
        return cls(executor_id, {d["name"]: frozenset(d.get("capabilities", ())) for d in declared})


def catalogue_path(path: str | Path | None = None) -> str | Path:
    """The platform catalogue: `path`, else `$AGENTRUN_CATALOGUE`, else the shipped one."""
    return path or os.environ.get("AGENTRUN_CATALOGUE") or SHIPPED_CATALOGUE


def load_catalogue(path: str | Path | None = None) -> dict[str, frozenset[str]]:
    """The platform catalogue's tools (name -> capabilities)."""
    data = json.loads(Path(catalogue_path(path)).read_text())
    return {t["name"]: frozenset(t.get("capabilities", ())) for t in data["tools"]}


def check(
    tools: Sequence[str], pools: Sequence[Pool], catalogue: Mapping[str, frozenset[str]]
) -> ToolCheck:
    """Refuse (InvalidArgument naming spec.tools[i]) a set the connected pools cannot run."""
    if not pools:
        return _against_catalogue(tools, catalogue)
    known = {name: caps for pool in pools for name, caps in pool.tools.items()}
    carried = ", ".join(sorted(known)) or "none"
    for i, name in enumerate(tools):
        if name in known:
            continue
        if name in catalogue:
            raise InvalidArgument(
                f"spec.tools[{i}]",
                f"{name!r}: no connected executor pool can run it (they carry: {carried})",
            )
        raise InvalidArgument(f"spec.tools[{i}]", f"unknown tool {name!r}")
    if not any(set(tools) <= pool.tools.keys() for pool in pools):
        raise InvalidArgument(
            "spec.tools",
            f"no connected executor carries all of {', '.join(tools)}: "
            "its runs could never be assigned",
        )
    return ToolCheck({name: known[name] for name in tools})


def _against_catalogue(tools: Sequence[str], catalogue: Mapping[str, frozenset[str]]) -> ToolCheck:
    for i, name in enumerate(tools):
        if name not in catalogue:
            raise InvalidArgument(f"spec.tools[{i}]", f"unknown tool {name!r}")
    warnings: tuple[PublishWarning, ...] = ()
    if tools:
        warnings = (
            PublishWarning(
                "no_executor",
                "no executor serving this workspace is connected: the tools were checked "
                "against the platform catalogue only, and runs wait until an executor "
                "carrying them connects",
                tuple(tools),
            ),
        )
    return ToolCheck({name: catalogue[name] for name in tools}, warnings)
