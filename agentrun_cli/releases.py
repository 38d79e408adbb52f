"""`agentrun releases list|show|drain|wait-drained|promote|ramp|rollback|move` and
`agentrun canary`.

A deploy script, with a platform admin key (AGENTRUN_API_KEY):

    agentrun canary --release B || exit 1           # the new release works end to end
    agentrun releases ramp B 10                      # 10 % of new runs go to B
    agentrun releases list                           # B's and A's completed/failed side by side
    agentrun releases promote B                      # all new runs, and parked runs, go to B
    agentrun releases drain A                        # A hands its runs back between turns
    agentrun releases wait-drained A --timeout 900   # exit 0 once nothing is held or waits on A
    agentrun releases rollback B                     # or: back to A, nothing stranded
    agentrun releases move --tag eu --all --release B    # every waiting run tagged eu (--dry-run counts)
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from agentrun.v1 import release_pb2 as pb
from agentrun.v1 import release_pb2_grpc, run_pb2
from agentrun_cli import credentials, durations, render

TIMEOUT = 30.0
POLL_SECONDS = 0.5


def _seconds(value: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


def _channel(args: argparse.Namespace) -> grpc.Channel:
    return credentials.channel(args.address, credentials.api_key("platform"))


def release_line(r: pb.Release) -> str:
    state = (
        "drained"
        if r.drained
        else "draining"
        if r.draining
        else "newest"
        if r.newest
        else "serving"
        if r.executors
        else "idle"
    )
    if r.HasField("ramp_percent") and not r.draining:
        state = f"ramp {r.ramp_percent}%"
    oldest = r.oldest_held.ToNanoseconds() / 1e9
    return (
        f"{r.name:<20} {state:<9} executors={len(r.executors)} held={r.runs_held} "
        f"oldest={oldest:.0f}s waiting={r.runs_waiting} "
        f"completed={r.runs_completed} failed={r.runs_failed} canary={canary_state(r)}"
    )


def runs_lines(r: pb.Release) -> str:
    """The runs a release holds or that wait on it, one a line."""
    return "".join(
        f"\n  run {x.run_id} workspace={x.workspace_id} {x.status}"
        + (f" ({x.wait_reason})" if x.wait_reason else "")
        for x in r.runs
    )


def canary_state(r: pb.Release) -> str:
    """passed, failed (naming the stage) or none yet."""
    if r.canary_failed_stage:
        return f"failed:{r.canary_failed_stage.replace(' ', '-')}"
    return "passed" if r.HasField("canary_pass_time") else "none"


def canary_failure(r: pb.Release) -> str:
    """`releases show`'s line on a failing canary ("" when its last canary did not fail)."""
    if not r.canary_failed_stage:
        return ""
    at = r.canary_fail_time.ToDatetime().strftime("%Y-%m-%d %H:%M:%SZ")
    return f"\n  canary failed at {at}, stage '{r.canary_failed_stage}': {r.canary_failure_reason}"


def _print(args: argparse.Namespace, value: Any, line: str) -> None:
    print(render.to_json(value, indent=2) if args.json else line)


def list_releases(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        resp = release_pb2_grpc.ReleaseServiceStub(channel).ListReleases(
            pb.ListReleasesRequest(), timeout=TIMEOUT
        )
    _print(args, resp, "\n".join(release_line(r) for r in resp.releases))
    return 0


def show(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        r = (
            release_pb2_grpc.ReleaseServiceStub(channel)
            .GetRelease(pb.GetReleaseRequest(name=args.name), timeout=TIMEOUT)
            .release
        )
    executors = "".join(f"\n  executor {e}" for e in r.executors)
    _print(args, r, release_line(r) + canary_failure(r) + executors + runs_lines(r))
    return 0


def drain(args: argparse.Namespace) -> int:
    req = pb.DrainReleaseRequest(name=args.name, force=args.force)
    if args.finish_within is not None:
        req.finish_within.CopyFrom(_seconds(args.finish_within))
    with _channel(args) as channel:
        r = release_pb2_grpc.ReleaseServiceStub(channel).DrainRelease(req, timeout=TIMEOUT)
    _print(args, r, release_line(r.release))
    return 0


def promote(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        r = release_pb2_grpc.ReleaseServiceStub(channel).PromoteRelease(
            pb.PromoteReleaseRequest(name=args.name), timeout=TIMEOUT
        )
    _print(args, r, release_line(r.release))
    return 0


def ramp(args: argparse.Namespace) -> int:
    req = pb.RampReleaseRequest(name=args.name, percent=args.percent)
    with _channel(args) as channel:
        r = release_pb2_grpc.ReleaseServiceStub(channel).RampRelease(req, timeout=TIMEOUT)
    _print(args, r, release_line(r.release))
    return 0


def rollback(args: argparse.Namespace) -> int:
    req = pb.RollbackReleaseRequest(name=args.name)
    if args.finish_within is not None:
        req.finish_within.CopyFrom(_seconds(args.finish_within))
    with _channel(args) as channel:
        r = release_pb2_grpc.ReleaseServiceStub(channel).RollbackRelease(req, timeout=TIMEOUT)
    _print(args, r, release_line(r.release))
    return 0


def wait_drained(args: argparse.Namespace) -> int:
    """Exit 0 once the release is drained (no executor left, no run held, no run waiting
    on it); 1 at the timeout, naming the runs still held or waiting."""
    deadline = time.monotonic() + args.timeout
    with _channel(args) as channel:
        stub = release_pb2_grpc.ReleaseServiceStub(channel)
        while True:
            r = stub.GetRelease(pb.GetReleaseRequest(name=args.name), timeout=TIMEOUT).release
            if r.drained or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
    if r.drained:
        print(f"drained: {release_line(r)}")
        return 0
    print(f"not drained after {args.timeout:g}s: {release_line(r)}{runs_lines(r)}", file=sys.stderr)
    return 1


def move(args: argparse.Namespace) -> int:
    """`releases move RUN_ID`, or `releases move --tag T --all` (BulkMoveRunsRelease, as
    `runs cancel --tag T --all` goes: the same filter flags, --dry-run, progress)."""
    filtered = args.agent or args.status or args.tag or args.metadata
    if not args.run_id:
        return bulk_move(args)
    if filtered or args.all or args.dry_run:
        raise SystemExit("give a RUN_ID or a filter with --all, not both")
    req = pb.MoveRunReleaseRequest(
        workspace_id=args.workspace, run_id=args.run_id, release=args.release
    )
    with _channel(args) as channel:
        r = release_pb2_grpc.ReleaseServiceStub(channel).MoveRunRelease(req, timeout=TIMEOUT)
    line = f"run {args.run_id}: release {r.from_release or '(none)'} -> {r.to_release or '(none)'}"
    _print(args, r, line)
    return 0


def bulk_move(args: argparse.Namespace) -> int:
    """Every unfinished run nobody holds that the filter matches, to --release; its progress
    on stderr after each batch of 500."""
    if not (args.all or args.dry_run):
        raise SystemExit(
            "give a RUN_ID, or add --all to move every run nobody holds that the filter matches "
            "(--dry-run counts them first)"
        )
    status = render.status_value(args.status) if args.status else 0
    req = pb.BulkMoveRunsReleaseRequest(
        workspace_id=args.workspace,
        filter=run_pb2.RunFilter(
            agent_id=args.agent, status=status, tag=args.tag, metadata=args.metadata
        ),
        all=args.all,
        dry_run=args.dry_run,
        release=args.release,
    )
    last = None
    with _channel(args) as channel:
        for last in release_pb2_grpc.ReleaseServiceStub(channel).BulkMoveRunsRelease(req):
            if not args.json and not last.finished:
                print(f"moved {last.done} of {last.matched}", file=sys.stderr, flush=True)
    assert last is not None, "a bulk action answers at least once"
    to = args.release or "(none: the newest)"
    if last.dry_run:
        line = f"{last.matched} unfinished runs match; nothing moved (--dry-run)"
    else:
        line = (
            f"moved {last.done} of {last.matched} runs to release {to} "
            f"({last.skipped} held or finished)"
        )
    _print(args, last, line)
    return 0


def canary(args: argparse.Namespace) -> int:
    """One line, PASS or FAIL; exit 0 only for a pass."""
    req = pb.RunCanaryRequest(release=args.release, timeout=_seconds(args.timeout))
    with _channel(args) as channel:
        r = release_pb2_grpc.CanaryServiceStub(channel).RunCanary(
            req, timeout=args.timeout + TIMEOUT
        )
    _print(args, r, r.verdict)
    return 0 if r.passed else 1


def _percent(value: str) -> int:
    try:
        percent = int(value.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a percentage (0 to 100)") from None
    if not 0 <= percent <= 100:
        raise argparse.ArgumentTypeError(f"{value!r} is not between 0 and 100")
    return percent


def _finish_within_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--finish-within",
        type=durations.arg,
        default=None,
        metavar="DURATION",
        help="time its executors work on held runs before handing each back at its next "
        "turn boundary (default: each executor's longest turn)",
    )


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "releases", help="releases: list, ramp, promote, drain, roll back, move runs"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("list", help="every release, newest first", parents=[common])
    p.set_defaults(handler=list_releases)
    p = actions.add_parser("show", help="one release and its executors", parents=[common])
    p.add_argument("name", metavar="RELEASE")
    p.set_defaults(handler=show)
    p = actions.add_parser("drain", help="drain a release's executors", parents=[common])
    p.add_argument("name", metavar="RELEASE")
    _finish_within_option(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="hand back turns in progress too (they wait for an executor of the release)",
    )
    p.set_defaults(handler=drain)
    p = actions.add_parser(
        "wait-drained",
        help="wait until nothing is held by or waits on a release",
        parents=[common],
    )
    p.add_argument("name", metavar="RELEASE")
    p.add_argument("--timeout", type=durations.arg, default=600.0, metavar="DURATION")
    p.set_defaults(handler=wait_drained)
    p = actions.add_parser("promote", help="send new runs to a release", parents=[common])
    p.add_argument("name", metavar="RELEASE")
    p.set_defaults(handler=promote)
    p = actions.add_parser(
        "ramp", help="send a percentage of new runs to a release", parents=[common]
    )
    p.add_argument("name", metavar="RELEASE")
    p.add_argument("percent", type=_percent, metavar="PERCENT", help="0 to 100 (10 or 10%%)")
    p.set_defaults(handler=ramp)
    p = actions.add_parser(
        "rollback", help="end a release's ramp or promotion and drain it", parents=[common]
    )
    p.add_argument("name", metavar="RELEASE")
    _finish_within_option(p)
    p.set_defaults(handler=rollback)
    _add_move(actions, common)
    p = sub.add_parser("canary", help="the contract canary: exit 0 on PASS", parents=[common])
    p.add_argument("--release", default="", help="only executors of this release may take it")
    p.add_argument("--timeout", type=durations.arg, default=10.0, metavar="DURATION")
    p.set_defaults(handler=canary)


def _add_move(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """releases move: one run, or every run a filter matches (BulkMoveRunsRelease)."""
    p = actions.add_parser(
        "move",
        help="move a waiting run, or every one a filter matches (--all), to another release",
        parents=[common],
    )
    p.add_argument("run_id", metavar="RUN_ID", nargs="?", help="one run (or a filter below)")
    p.add_argument("--release", default="", help="the release (default: none, the newest)")
    p.add_argument("--agent", default="", metavar="A")
    p.add_argument("--status", choices=["queued", "waiting"])
    p.add_argument("--tag", default="", metavar="T", help="runs carrying this tag")
    p.add_argument("--metadata", default="", metavar="K=V", help="runs whose metadata K is V")
    p.add_argument(
        "--all",
        action="store_true",
        help="move every run nobody holds that the filter matches (alone: every one)",
    )
    p.add_argument("--dry-run", action="store_true", help="only count the runs --all would move")
    p.set_defaults(handler=move)
