"""The publish-time tool check: known tools, tools some connected pool can run."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.ground.errors import InvalidArgument

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
    tools: Sequence[str],
    pools: Sequence[Pool],
    catalogue: Mapping[str, frozenset[str]],
    portable: Mapping[str, frozenset[str]] | None = None,
) -> ToolCheck:
    """Refuse (InvalidArgument naming spec.tools[i]) a set the connected pools cannot run.

    `portable`: the workspace's own registry tools (name -> capability marks): the executor
    calls them from their definitions, so any executor runs them and only the rest (the
    built-ins, which need executor code) are checked against the pools."""
    portable = portable or {}
    code = [name for name in tools if name not in portable]
    if not pools:
        checked = _against_catalogue(tools, code, catalogue)
    else:
        checked = _against_pools(tools, code, pools, catalogue)
    return ToolCheck({**checked.capabilities, **portable}, checked.warnings)


def _against_pools(
    tools: Sequence[str],
    code: Sequence[str],
    pools: Sequence[Pool],
    catalogue: Mapping[str, frozenset[str]],
) -> ToolCheck:
    known = {name: caps for pool in pools for name, caps in pool.tools.items()}
    carried = ", ".join(sorted(known)) or "none"
    for i, name in enumerate(tools):
        if name in known or name not in code:
            continue
        if name in catalogue:
            raise InvalidArgument(
                f"spec.tools[{i}]",
                f"{name!r}: no connected executor pool can run it (they carry: {carried})",
            )
        raise InvalidArgument(f"spec.tools[{i}]", f"unknown tool {name!r}")
    if not any(set(code) <= pool.tools.keys() for pool in pools):
        raise InvalidArgument(
            "spec.tools",
            f"no connected executor carries all of {', '.join(code)}: "
            "its runs could never be assigned",
        )
    return ToolCheck({name: known[name] for name in code})


def _against_catalogue(
    tools: Sequence[str], code: Sequence[str], catalogue: Mapping[str, frozenset[str]]
) -> ToolCheck:
    for i, name in enumerate(tools):
        if name in code and name not in catalogue:
            raise InvalidArgument(f"spec.tools[{i}]", f"unknown tool {name!r}")
    warnings: tuple[PublishWarning, ...] = ()
    if code:
        warnings = (
            PublishWarning(
                "no_executor",
                "no executor serving this workspace is connected: the tools were checked "
                "against the platform catalogue only, and runs wait until an executor "
                "carrying them connects",
                tuple(code),
            ),
        )
    return ToolCheck({name: catalogue[name] for name in code}, warnings)
