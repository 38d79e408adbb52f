"""`agentrun dev --agents DIR --scenarios DIR`: the user's own agents, tools and scenarios,
applied when the stack is up and again whenever a file changes, without a restart.

* `--agents DIR`: every `*.yaml`, `*.yml` and `*.json` file in DIR (not below it) is an agent
  file (it has `agent:`, agentrun_cli/agent_files.py, what `agents apply` reads) or a tool file
  (agentrun_cli/tool_files.py, what `tools create -f` reads). Tools are saved first, then each
  agent is applied as `agents apply` does: a changed spec, or a new version of a tool it uses,
  publishes a new version, and the next run uses it.
* `--scenarios DIR`: scenario files for the model sandbox (sandbox/scenario.py), served before
  the built-in ones; the sandbox reads a changed file at the next request, and the loop says
  whether it is valid. When both options name the same directory, its `*.json` files are the
  scenarios and its YAML files the agents and tools.

The directories are polled (their files' mtimes and sizes, every POLL_SECONDS); a file that
cannot be applied is reported with its path and what is wrong, and the loop carries on.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc
import yaml

from agentrun.v1 import tool_pb2, tool_pb2_grpc
from agentrun_cli import agent_files, tool_files
from agentrun_cli.client import Client
from agentrun_cli.spec_files import SpecFileError

POLL_SECONDS = 0.5
SPEC_SUFFIXES = frozenset({".yaml", ".yml", ".json"})
SCENARIO_SUFFIXES = frozenset({".json"})

# path -> (mtime in ns, size): a file written again within the same mtime tick still differs
# by its size in the common case, and the next write moves the mtime anyway.
Snapshot = dict[Path, tuple[int, int]]


def snapshot(directory: Path | None, suffixes: Iterable[str]) -> Snapshot:
    """The regular files of `directory` with one of `suffixes` (hidden ones left out)."""
    if directory is None:
        return {}
    wanted = set(suffixes)
    try:
        entries = list(directory.iterdir())
    except OSError:
        return {}
    found: Snapshot = {}
    for path in entries:
        if path.suffix not in wanted or path.name.startswith("."):
            continue
        try:
            st = path.stat()
        except OSError:  # removed meanwhile
            continue
        if stat.S_ISREG(st.st_mode):
            found[path] = (st.st_mtime_ns, st.st_size)
    return found


def check_directory(option: str, directory: Path | None) -> None:
    """A ValueError naming the option when `directory` is given but is not a directory."""
    if directory is not None and not directory.is_dir():
        raise ValueError(f"{option} {directory}: not a directory")


class DevLoop:
    """Applies the agents directory and checks the scenarios directory when they change."""

    def __init__(
        self,
        client: Callable[[], Client],
        say: Callable[[str], None],
        agents: Path | None = None,
        scenarios: Path | None = None,
    ) -> None:
        self._client = client
        self._say = say
        self.poll_seconds = POLL_SECONDS
        self.agents = agents.resolve() if agents else None
        self.scenarios = scenarios.resolve() if scenarios else None
        self._spec_suffixes = (
            SPEC_SUFFIXES - SCENARIO_SUFFIXES if self.agents == self.scenarios else SPEC_SUFFIXES
        )
        self._agents_seen: Snapshot = {}
        self._scenarios_seen: Snapshot = {}

    def poll(self) -> None:
        """Apply what changed since the last poll (everything, the first time)."""
        agents = snapshot(self.agents, self._spec_suffixes)
        if self.agents is not None and agents != self._agents_seen:
            self._agents_seen = agents
            self.apply_agents(sorted(agents))
        scenarios = snapshot(self.scenarios, SCENARIO_SUFFIXES)
        if scenarios != self._scenarios_seen:
            changed = [p for p in sorted(scenarios) if self._scenarios_seen.get(p) != scenarios[p]]
            self._scenarios_seen = scenarios
            self.check_scenarios(changed)

    # --- agents and tools ---------------------------------------------------------------------

    def apply_agents(self, paths: list[Path]) -> None:
        """Save the tool files' tools, then apply each agent file; report each file's errors."""
        agents: list[tuple[Path, agent_files.AgentFile]] = []
        tools: list[tuple[Path, list[tool_pb2.Tool]]] = []
        for path in paths:
            try:
                doc = yaml.safe_load(path.read_text(encoding="utf-8"))
                if isinstance(doc, dict) and "agent" in doc:
                    agents.append((path, agent_files.parse(doc, str(path))))
                else:
                    tools.append((path, tool_files.load(str(path))))
            except SpecFileError as err:
                self._error(str(err))
            except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:
                self._error(f"{path}: cannot read it: {err}")
        try:
            with self._client() as client:
                changed = self._save_tools(client, tools)
                for path, file in agents:
                    self._apply_agent(client, path, file, changed)
        except grpc.RpcError as err:  # the control plane is gone: the next change tries again
            self._error(f"{self.agents}: {_rpc_error(err)}")

    def _save_tools(
        self, client: Client, files: list[tuple[Path, list[tool_pb2.Tool]]]
    ) -> set[str]:
        """Save each tool (a new version only when it changed); the names that changed."""
        stub = tool_pb2_grpc.ToolServiceStub(client.channel)
        changed = set()
        for path, tools in files:
            for tool in tools:
                tool.source = "file"
                request = tool_pb2.CreateToolRequest(workspace_id=client.workspace, tool=tool)
                try:
                    answer = stub.CreateTool(request, timeout=client.timeout)
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.UNAVAILABLE:
                        raise
                    self._error(f"{path}: tool {tool.name}: {_rpc_error(err)}")
                    continue
                if answer.created:
                    changed.add(tool.name)
                    self._say(f"{path.name}: saved tool {tool.name} v{answer.tool.version}")
        return changed

    def _apply_agent(
        self, client: Client, path: Path, file: agent_files.AgentFile, changed_tools: set[str]
    ) -> None:
        from agentrun_cli.commands import apply_agent

        uses_changed = bool(changed_tools & set(file.spec.tools))
        try:
            applied = apply_agent(client, file, str(path), tools_changed=uses_changed)
        except SpecFileError as err:
            self._error(str(err))
            return
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise
            self._error(f"{path}: agent {file.agent_id}: {_rpc_error(err)}")
            return
        if applied.published or applied.created or applied.saved:  # quiet when unchanged
            for line in applied.lines():
                self._say(f"{path.name}: {line}")
        for warning in applied.warnings:
            self._say(f"{path.name}: warning: {warning}")

    # --- scenarios ----------------------------------------------------------------------------

    def check_scenarios(self, paths: list[Path]) -> None:
        """Say whether each changed scenario file is one the sandbox can play."""
        from sandbox.scenario import ScenarioError, load_file

        for path in paths:
            try:
                scenario = load_file(path.stem, path)
            except (ScenarioError, OSError, UnicodeDecodeError) as err:
                self._error(f"{path}: {err}")
                continue
            turns = len(scenario.turns)
            self._say(
                f"{path.name}: scenario {path.stem} ready ({turns} turn(s); model: {path.stem})"
            )

    def _error(self, text: str) -> None:
        self._say(f"error: {text}")


def _rpc_error(err: grpc.RpcError) -> str:
    return f"{err.code().name}: {err.details()}"
