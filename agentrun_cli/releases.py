"""`agentrun releases list|show|drain|wait-drained|promote|move` and `agentrun canary`.

A deploy script, with a platform admin key (AGENTRUN_API_KEY):

    agentrun canary --release B || exit 1           # the new release works end to end
    agentrun releases promote B                      # new runs go to B
    agentrun releases drain A --finish-within 600    # A finishes what it holds, then exits
    agentrun releases wait-drained A --timeout 900   # exit 0 once A holds nothing
    agentrun releases move RUN_ID --release B        # a run left waiting on A, explicitly
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from agentrun.v1 import release_pb2 as pb
from agentrun.v1 import release_pb2_grpc
from agentrun_cli import argtypes, credentials, render

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
    oldest = r.oldest_held.ToNanoseconds() / 1e9
    return (
        f"{r.name:<20} {state:<9} executors={len(r.executors)} held={r.runs_held} "
        f"oldest={oldest:.0f}s waiting={r.runs_waiting}"
    )


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
    _print(args, r, release_line(r) + "".join(f"\n  executor {e}" for e in r.executors))
    return 0


def drain(args: argparse.Namespace) -> int:
    req = pb.DrainReleaseRequest(name=args.name, finish_within=_seconds(args.finish_within))
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


def wait_drained(args: argparse.Namespace) -> int:
    """Exit 0 once the release is drained (no executor left, no run held); 1 at the timeout."""
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
    print(f"not drained after {args.timeout:g}s: {release_line(r)}", file=sys.stderr)
    return 1


def move(args: argparse.Namespace) -> int:
    req = pb.MoveRunReleaseRequest(
        workspace_id=args.workspace, run_id=args.run_id, release=args.release
    )
    with _channel(args) as channel:
        r = release_pb2_grpc.ReleaseServiceStub(channel).MoveRunRelease(req, timeout=TIMEOUT)
    line = f"run {args.run_id}: release {r.from_release or '(none)'} -> {r.to_release or '(none)'}"
    _print(args, r, line)
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


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "releases", help="blue-green releases: list, drain, promote, move runs"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("list", help="every release, newest first", parents=[common])
    p.set_defaults(handler=list_releases)
    p = actions.add_parser("show", help="one release and its executors", parents=[common])
    p.add_argument("name", metavar="RELEASE")
    p.set_defaults(handler=show)
    p = actions.add_parser("drain", help="drain a release's executors", parents=[common])
    p.add_argument("name", metavar="RELEASE")
    p.add_argument(
        "--finish-within",
        type=argtypes.seconds,
        default=60.0,
        metavar="SECONDS",
        help="time to finish held runs before handing them back (default 60)",
    )
    p.set_defaults(handler=drain)
    p = actions.add_parser(
        "wait-drained", help="wait until a release holds nothing", parents=[common]
    )
    p.add_argument("name", metavar="RELEASE")
    p.add_argument("--timeout", type=argtypes.seconds, default=600.0, metavar="SECONDS")
    p.set_defaults(handler=wait_drained)
    p = actions.add_parser("promote", help="send new runs to a release", parents=[common])
    p.add_argument("name", metavar="RELEASE")
    p.set_defaults(handler=promote)
    p = actions.add_parser("move", help="move a waiting run to another release", parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--release", default="", help="the release (default: none, the newest)")
    p.set_defaults(handler=move)
    p = sub.add_parser("canary", help="the contract canary: exit 0 on PASS", parents=[common])
    p.add_argument("--release", default="", help="only executors of this release may take it")
    p.add_argument("--timeout", type=argtypes.seconds, default=10.0, metavar="SECONDS")
    p.set_defaults(handler=canary)
