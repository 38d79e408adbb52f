"""Handlers of `agentrun agents …` and `agentrun runs …`: call the API, print text or JSON."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import duration_pb2

from agentrun.v1 import agent_pb2
from agentrun_cli import render
from agentrun_cli.client import Client


def _client(args: argparse.Namespace) -> Client:
    return Client(args.address, args.workspace)


def _emit(args: argparse.Namespace, value: Any, lines: Iterable[str]) -> None:
    """JSON of `value` with --json, else the readable `lines`."""
    if args.json:
        print(render.to_json(value, indent=2))
    else:
        for line in lines:
            print(line)


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
        model=args.model, instructions=args.instructions, tools=args.tools, limits=limits,
        model_profile=args.model_profile,
        model_parameters=parameters if parameters.ListFields() else None,
        connections=_connections(args.connections or []),
    )  # fmt: skip


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
    for warning in resp.warnings:  # on stderr, so --json output stays one value
        print(render.publish_warning(warning), file=sys.stderr)
    return 0


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
            args.agent_id, args.input, args.version, args.request_id, args.trigger_connection
        )
        note = "started" if resp.created else "already started (same request id)"
        if args.json and args.watch:
            print(render.to_json(resp), flush=True)  # one JSON value a line, like the events
        else:
            _emit(args, resp, [f"{note}: run {resp.run.run_id}", render.state_line(resp.run)])
        if args.watch:
            _follow(client, args, resp.run.run_id, from_seq=0)
    return 0


def runs_show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        run = client.get_run(args.run_id)
        steps = list(client.list_steps(args.run_id))
    lines = [*render.run_summary(run), "", *render.step_table(steps)]
    _emit(args, {"run": run, "steps": steps}, lines)
    return 0


def runs_list(args: argparse.Namespace) -> int:
    status = render.status_value(args.status) if args.status else 0
    with _client(args) as client:
        for run in client.list_runs(args.agent, status, args.limit):
            print(render.to_json(run) if args.json else render.run_row(run), flush=True)
    return 0


def runs_watch(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _follow(client, args, args.run_id, args.from_seq)
    return 0


def runs_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        run = client.cancel_run(args.run_id, args.reason)
    _emit(args, run, [f"run {run.run_id} {render.state_line(run)}"])
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
    state = (f"answered call {sig.consumed_seq} (step {sig.result_seq})" if sig.consumed_seq
             else "in the run's mailbox")  # fmt: skip
    again = "" if resp.created else " (already sent: the first signal with this event id)"
    lines = [f"signal {sig.signal_name} {sig.event_id}: {state}{again}",
             f"run {resp.run.run_id} {render.state_line(resp.run)}"]  # fmt: skip
    _emit(args, resp, lines)
    return 0


def _follow(client: Client, args: argparse.Namespace, run_id: str, from_seq: int) -> None:
    """Print a run's steps and state changes until the stream ends (one JSON event a line)."""
    watch = client.watch(run_id, from_seq, on_retry=_retry_notice)
    if args.json:
        for event in watch:
            print(render.to_json(event), flush=True)
        return
    for line in render.event_lines(watch):
        print(line, flush=True)


def _retry_notice(err: grpc.RpcError, delay: float) -> None:
    print(f"(watch: {err.code().name}; reconnecting in {delay:.1f}s)", file=sys.stderr)
