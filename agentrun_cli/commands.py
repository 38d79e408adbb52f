"""Handlers of `agentrun agents …` and `agentrun runs …`: call the API, print text or JSON."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf import duration_pb2

from agentrun.v1 import agent_pb2, run_pb2, tool_pb2, tool_pb2_grpc
from agentrun_cli import agent_files, durations, output, render
from agentrun_cli.client import Client, RunWatch
from agentrun_cli.output import Column


def _client(args: argparse.Namespace) -> Client:
    return Client(args.address, args.workspace)


def _emit(args: argparse.Namespace, value: Any, lines: Iterable[str]) -> None:
    """JSON of `value` with -o json/jsonl, else the readable `lines`."""
    output.emit(args, value, lines)


# --- agents ----------------------------------------------------------------


def agents_create(args: argparse.Namespace) -> int:
    with _client(args) as client:
        agent = client.create_agent(args.agent_id, args.name)
    _emit(args, agent, [f"created agent {agent.agent_id} in workspace {agent.workspace_id}"])
    return 0


def _spec(args: argparse.Namespace) -> agent_pb2.AgentSpec:
    limits = agent_pb2.RunLimits(max_steps=args.max_steps)
    if args.deadline is not None:
        deadline = duration_pb2.Duration()
        deadline.FromNanoseconds(round(args.deadline * 1e9))
        limits.deadline.CopyFrom(deadline)
    parameters = agent_pb2.ModelParameters(max_tokens=args.max_output_tokens)
    if args.temperature is not None:
        parameters.temperature = args.temperature
    return agent_pb2.AgentSpec(
        model=args.model,
        instructions=args.instructions,
        tools=args.tools or [],
        limits=limits,
        model_profile=args.model_profile,
        model_parameters=parameters if parameters.ListFields() else None,
        connections=_connections(args.connections or []),
    )


def _connections(pairs: list[str]) -> dict[str, str]:
    """`--connection PROVIDER=ID` (or `PROVIDER=trigger`) as AgentSpec.connections."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        provider, sep, connection = pair.partition("=")
        if not sep or not provider or not connection:
            raise SystemExit(f"--connection {pair!r}: expected PROVIDER=CONNECTION_ID or =trigger")
        mapping[provider] = connection
    return mapping


def agents_publish(args: argparse.Namespace) -> int:
    with _client(args) as client:
        resp = client.publish_version(args.agent_id, _spec(args), args.acknowledge_trifecta)
    version = resp.version
    _emit(args, version, [f"published {version.agent_id} v{version.version}"])
    _warn(resp.warnings)
    return 0


def _warn(warnings: Iterable[agent_pb2.PublishWarning]) -> None:
    for warning in warnings:  # on stderr, so --json output stays one value
        print(render.publish_warning(warning), file=sys.stderr)


AGENT_COLUMNS = [
    Column("agent", lambda a: a.agent_id),
    Column("name", lambda a: a.display_name),
    Column("latest", lambda a: f"v{a.latest_version}" if a.latest_version else "-", right=True),
    Column("created", lambda a: render.timestamp(a.create_time)),
]


def agents_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        agents = list(client.list_agents())
    if args.quiet:
        for a in agents:
            print(a.agent_id)
        return 0
    empty = (
        f"no agents in workspace {args.workspace!r} at {args.address} yet: write one as a file "
        "and `agentrun agents apply -f agent.yaml` (examples/ has some)"
    )
    output.emit_list(args, agents, AGENT_COLUMNS, empty)
    return 0


def agents_apply(args: argparse.Namespace) -> int:
    """Create the agent if missing; publish the file's spec unless the latest version has it."""
    file = agent_files.load(args.file)
    with _client(args) as client:
        applied = apply_agent(client, file, args.file)
    value = {
        "agent": applied.agent,
        "version": applied.version,
        "created": applied.created,
        "published": applied.published,
    }
    _emit(args, value, applied.lines())
    _warn(applied.warnings)
    return 0


@dataclass(frozen=True)
class Applied:
    """What applying one agent file did."""

    agent_id: str
    agent: agent_pb2.Agent
    version: agent_pb2.AgentVersion
    saved: list[tool_pb2.Tool]
    created: bool
    published: bool
    warnings: list[str]

    def lines(self) -> list[str]:
        lines = [f"saved tool {t.name} v{t.version}" for t in self.saved]
        lines += [f"created agent {self.agent_id}"] if self.created else []
        lines.append(
            f"published {self.agent_id} v{self.version.version}"
            if self.published
            else f"{self.agent_id} v{self.version.version} already has this spec; nothing published"
        )
        return lines


def apply_agent(
    client: Client, file: agent_files.AgentFile, path: str, tools_changed: bool = False
) -> Applied:
    """`agents apply` of one loaded file (also `agentrun dev --agents`); `tools_changed`: a
    tool it uses has a new version, which only a new agent version picks up."""
    _check_name(client, file, path)  # before anything is saved
    saved = _save_tools(client, file)
    created = _ensure_agent(client, file)
    agent = client.get_agent(file.agent_id)
    latest = client.get_version(file.agent_id) if agent.latest_version else None
    # A new version of a tool the file defines needs a new agent version to be used.
    unchanged = not saved and not tools_changed
    if latest is not None and unchanged and agent_files.same_spec(latest.spec, file.spec):
        return Applied(file.agent_id, agent, latest, saved, created, False, [])
    resp = client.publish_version(file.agent_id, file.spec, file.acknowledge_trifecta)
    return Applied(file.agent_id, agent, resp.version, saved, created, True, list(resp.warnings))


def _check_name(client: Client, file: agent_files.AgentFile, path: str) -> None:
    """A file's `name:` names the agent when it is created; an agent that exists under
    another name is an error naming both (it used to be ignored without a word)."""
    if not file.display_name:
        return
    try:
        agent = client.get_agent(file.agent_id)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return
    if agent.display_name == file.display_name:
        return
    named, fix = (
        (f"is named {agent.display_name!r}", f"write name: {agent.display_name!r} or leave it out")
        if agent.display_name
        else ("has no name", "leave name: out")
    )
    raise agent_files.AgentFileError(
        f"{path}: name: {file.display_name!r}, but agent {file.agent_id!r} {named}; apply "
        f"names an agent only when it creates it: {fix}"
    )


def _save_tools(client: Client, file: agent_files.AgentFile) -> list[tool_pb2.Tool]:
    """Save the file's tool definitions; the new versions (an unchanged one saves none)."""
    stub = tool_pb2_grpc.ToolServiceStub(client.channel)
    saved = []
    for tool in file.tools:
        tool.source = "file"
        request = tool_pb2.CreateToolRequest(workspace_id=client.workspace, tool=tool)
        answer = stub.CreateTool(request, timeout=client.timeout)
        if answer.created:
            saved.append(answer.tool)
    return saved


def _ensure_agent(client: Client, file: agent_files.AgentFile) -> bool:
    """Create the agent; False when it exists already."""
    try:
        client.create_agent(file.agent_id, file.display_name)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
        return False
    return True


def agents_show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        agent = client.get_agent(args.agent_id)
        version = client.get_version(args.agent_id) if agent.latest_version else None
    _emit(args, {"agent": agent, "version": version}, render.agent_lines(agent, version))
    return 0


# --- runs ------------------------------------------------------------------


def runs_start(args: argparse.Namespace) -> int:
    with _client(args) as client:
        resp = client.start_run(
            args.agent_id,
            args.input,
            args.version,
            args.request_id,
            args.trigger_connection,
            args.priority,
            args.tag,
            args.metadata,
        )
        note = "started" if resp.created else "already started (same request id)"
        if args.json and args.watch:
            print(render.to_json(resp), flush=True)  # one JSON value a line, like the events
        else:
            _emit(args, resp, [f"{note}: run {resp.run.run_id}", render.state_line(resp.run)])
        if args.watch:
            _follow(client, args, resp.run.run_id, from_seq=0)
    return 0


STEP_COLUMNS = [
    Column("seq", lambda s: s.seq, right=True),
    Column("time", lambda s: render.timestamp(s.create_time)),
    Column("kind", lambda s: render.kind_name(s.kind)),
    Column("epoch", lambda s: s.epoch, right=True),
    Column("summary", render.step_summary),
]


def runs_show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        run = client.get_run(args.run_id)
        steps = list(client.list_steps(args.run_id))
    if output.fmt(args) != "table":
        output.emit(args, {"run": run, "steps": steps}, [])
        return 0
    print("\n".join(render.run_summary(run)) + "\n", flush=True)
    output.emit_list(args, steps, STEP_COLUMNS, empty="(no steps yet)")
    return 0


def runs_export(args: argparse.Namespace) -> int:
    """Every committed step of the run, once each, in seq order, one JSON object a line
    (`agentrun runs export RUN > run.jsonl`), printed as the pages of ListRunSteps come."""
    with _client(args) as client:
        client.get_run(args.run_id)  # NOT_FOUND for an unknown (or deleted) run, not silence
        for step in client.list_steps(args.run_id):
            print(render.to_json(step), flush=True)
    return 0


_STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "cancelled": "dim",
    "waiting": "yellow",
    "running": "cyan",
    "queued": "blue",
}

RUN_COLUMNS = [
    Column("run id", lambda r: r.run_id),
    Column("agent", lambda r: f"{r.agent_id} v{r.agent_version}"),
    Column(
        "status",
        render.status_label,
        # Refused calls (issue 48): never the green of a plain success.
        style=lambda r: (
            "yellow"
            if r.counters.refused_calls and r.outcome
            else _STATUS_STYLE.get(render.status_name(r.status), "")
        ),
    ),
    Column("wait", lambda r: r.wait_reason),
    Column("created", lambda r: render.timestamp(r.create_time)),
    Column("elapsed", lambda r: render.duration(render.elapsed(r)), right=True),
    Column("active", lambda r: render.duration(render.active(r)), right=True),
    Column("steps", lambda r: r.counters.steps, right=True),
    Column("tokens", lambda r: render.tokens(r.counters.tokens), right=True),
]


def runs_list(args: argparse.Namespace) -> int:
    status = render.status_value(args.status) if args.status else 0
    since = (
        datetime.now(UTC) - timedelta(seconds=durations.positive(args.since))
        if args.since
        else None
    )
    stuck = durations.positive(args.waiting_longer_than) if args.waiting_longer_than else None
    with _client(args) as client:
        found = client.list_runs(
            args.agent, status, args.limit, since, args.search or "", stuck, args.tag, args.metadata
        )
        runs = list(found)
    if args.quiet:  # ids only, for scripts: RUN=$(agentrun runs list -q --limit 1)
        for r in runs:
            print(r.run_id)
        return 0
    output.emit_list(args, runs, RUN_COLUMNS, empty=_no_runs(args))
    return 0


def _no_runs(args: argparse.Namespace) -> str:
    """Why `runs list` printed nothing, and what to do."""
    filters = [
        f"{flag} {value}"
        for flag, value in (
            ("--agent", args.agent),
            ("--status", args.status),
            ("--since", args.since),
            ("--search", args.search),
            ("--waiting-longer-than", args.waiting_longer_than),
            ("--tag", args.tag),
            ("--metadata", args.metadata),
        )
        if value
    ]
    where = f"workspace {args.workspace!r} at {args.address}"
    if filters:
        return f"no runs in {where} match {' '.join(filters)}; drop a filter to see more"
    return (
        f"no runs in {where} yet: start one with `agentrun runs start AGENT --input TEXT` "
        "(`agentrun agents list` shows the agents)"
    )


def runs_watch(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _follow(client, args, args.run_id, args.from_seq)
    return 0


def runs_cancel(args: argparse.Namespace) -> int:
    filtered = args.agent or args.status or args.tag or args.metadata
    if args.run_id:
        if filtered or args.all or args.dry_run:
            raise SystemExit("give a RUN_ID or a filter with --all, not both")
        with _client(args) as client:
            run = client.cancel_run(args.run_id, args.reason)
        _emit(args, run, [f"run {run.run_id} {render.state_line(run)}"])
        return 0
    if not (args.all or args.dry_run):
        raise SystemExit(
            "give a RUN_ID, or add --all to cancel every unfinished run the filter matches "
            "(--dry-run counts them first)"
        )
    status = render.status_value(args.status) if args.status else 0
    run_filter = run_pb2.RunFilter(
        agent_id=args.agent, status=status, tag=args.tag, metadata=args.metadata
    )
    last = None
    with _client(args) as client:
        for last in client.bulk_cancel(run_filter, args.all, args.dry_run, args.reason):
            if not args.json and not last.finished:
                print(f"cancelled {last.done} of {last.matched}", file=sys.stderr, flush=True)
    assert last is not None, "a bulk action answers at least once"
    if last.dry_run:
        line = f"{last.matched} unfinished runs match; nothing cancelled (--dry-run)"
    else:
        line = f"cancelled {last.done} of {last.matched} runs ({last.skipped} ended on their own)"
    _emit(args, last, [line])
    return 0


def runs_rerun(args: argparse.Namespace) -> int:
    """`runs rerun --tag T --all [--dry-run]`: BulkRerunRuns, its progress on stderr."""
    if not (args.all or args.dry_run):
        raise SystemExit(
            "add --all to run again every run the filter matches (--dry-run counts them first)"
        )
    status = render.status_value(args.status) if args.status else 0
    run_filter = run_pb2.RunFilter(
        agent_id=args.agent, status=status, tag=args.tag, metadata=args.metadata
    )
    last = None
    with _client(args) as client:
        for last in client.bulk_rerun(run_filter, args.all, args.dry_run):
            if not args.json and not last.finished:
                print(f"started {last.done} of {last.matched}", file=sys.stderr, flush=True)
    assert last is not None, "a bulk action answers at least once"
    if last.dry_run:
        line = f"{last.matched} runs match; nothing started (--dry-run)"
    else:
        line = f"started {last.done} of {last.matched} runs again ({last.skipped} skipped)"
    _emit(args, last, [line])
    return 0


def runs_pause(args: argparse.Namespace) -> int:
    """`runs pause|resume RUN_ID`, `--agent A` or `--queue`."""
    verb = "paused" if args.paused else "resumed"
    with _client(args) as client:
        if args.run_id:
            run = client.pause_run(args.run_id, args.paused)
            _emit(args, run, [f"run {run.run_id} {verb}: {render.state_line(run)}"])
            return 0
        resp = client.set_queue_paused(args.agent, args.paused)
    what = f"agent {args.agent}" if args.agent else f"workspace {args.workspace} queue"
    _emit(args, resp, [f"{what} {verb} ({resp.queued_runs} queued or waiting runs)"])
    return 0


def runs_resolve(args: argparse.Namespace) -> int:
    with _client(args) as client:
        resp = client.resolve_unknown(args.run_id, args.seq, args.decision, args.by, args.note)
    lines = [render.step_line(resp.step), f"run {resp.run.run_id} {render.state_line(resp.run)}"]
    _emit(args, resp, lines)
    return 0


def runs_signal(args: argparse.Namespace) -> int:
    with _client(args) as client:
        resp = client.signal_run(args.run_id, args.name, args.event_id, args.payload)
    sig = resp.signal
    state = (
        f"answered call {sig.consumed_seq} (step {sig.result_seq})"
        if sig.consumed_seq
        else "in the run's mailbox"
    )
    again = "" if resp.created else " (already sent: the first signal with this event id)"
    lines = [
        f"signal {sig.signal_name} {sig.event_id}: {state}{again}",
        f"run {resp.run.run_id} {render.state_line(resp.run)}",
    ]
    _emit(args, resp, lines)
    return 0


def _follow(client: Client, args: argparse.Namespace, run_id: str, from_seq: int) -> None:
    """Print a run's steps and state changes until the stream ends (one JSON event a line),
    or until the run reaches a status of --until."""
    watch = client.watch(run_id, from_seq, on_retry=_retry_notice)
    events = _until(watch, set(getattr(args, "until", None) or ()))
    if args.json:
        output.emit_stream(args, events, render.to_json)
        return
    for line in render.event_lines(events):
        print(line, flush=True)


def _until(watch: RunWatch, statuses: set[str]) -> Iterator[run_pb2.WatchRunResponse]:
    for event in watch:
        yield event
        if event.HasField("run") and render.status_name(event.run.status) in statuses:
            watch.cancel()
            return


def _retry_notice(err: grpc.RpcError, delay: float) -> None:
    print(f"(watch: {err.code().name}; reconnecting in {delay:.1f}s)", file=sys.stderr)
