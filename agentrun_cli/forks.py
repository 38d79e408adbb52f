"""`agentrun runs fork RUN --from-seq N [--version V]` and `agentrun runs forks RUN`.

agentrun runs fork 3f0c… --from-seq 6              # the model answers step 6 again
agentrun runs fork 3f0c… --from-seq 3 --version 4  # the same log, a newer version from there
agentrun runs fork 3f0c… --from-seq 6 --priority 50  # ahead of the queue (default: the source's)
agentrun runs forks 3f0c…                          # the forks of a run, newest first
"""

from __future__ import annotations

import argparse

from agentrun.v1 import run_pb2
from agentrun_cli import argtypes, render, triggers
from agentrun_cli.client import Client


def add_commands(runs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = runs.add_parser(
        "fork",
        parents=[common],
        help="start a new run from a copy of a run's log up to a step (nothing before it is redone)",
    )
    p.add_argument("run_id", metavar="RUN_ID", help="the source run")
    p.add_argument(
        "--from-seq", type=argtypes.int32, required=True, metavar="N", help="the last step copied"
    )
    p.add_argument(
        "--version", type=argtypes.int32, default=0, metavar="V", help="default: the source's"
    )
    triggers.add_priority(p, default=None, unset="the source's")
    p.add_argument("--watch", action="store_true", help="then watch the fork to the end")
    p.set_defaults(handler=runs_fork)
    p = runs.add_parser("forks", help="a run's forks, newest first", parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.set_defaults(handler=runs_forks)


def runs_fork(args: argparse.Namespace) -> int:
    with Client(args.address, args.workspace) as client:
        req = run_pb2.ForkRunRequest(
            workspace_id=client.workspace,
            run_id=args.run_id,
            from_seq=args.from_seq,
            agent_version=args.version,
            priority=args.priority,
        )
        run = client.runs.ForkRun(req, timeout=client.timeout).run
        if args.json:
            print(render.to_json(run), flush=True)
        else:
            print(
                f"forked run {run.run_id} from {run.forked_from_run_id} after step "
                f"{run.forked_from_seq} ({run.agent_id} v{run.agent_version})",
                flush=True,
            )
            print(render.state_line(run), flush=True)
        if args.watch:
            watch = client.watch(run.run_id, run.forked_from_seq + 1)
            events = (render.to_json(e) for e in watch) if args.json else render.event_lines(watch)
            for line in events:
                print(line, flush=True)
    return 0


def runs_forks(args: argparse.Namespace) -> int:
    with Client(args.address, args.workspace) as client:
        req = run_pb2.ListRunsRequest(
            workspace_id=client.workspace, forked_from_run_id=args.run_id, page_size=500
        )
        while True:
            resp = client.runs.ListRuns(req, timeout=client.timeout)
            for run in resp.runs:
                line = render.run_row(run) + f"  from step {run.forked_from_seq}"
                print(render.to_json(run) if args.json else line, flush=True)
            if not resp.next_page_token:
                return 0
            req.page_token = resp.next_page_token
