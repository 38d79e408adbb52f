"""`python -m bench [commit|auth|claim|fairness|http|e2e|retention|fastpath|streams|events|held|keys ...] [--quick] [--loop asyncio,uvloop]`.

Runs them in order and prints. `--loop` runs each benchmark once per named event loop, back
to back, with AGENTRUN_EVENT_LOOP set for the control plane and executors it starts (the
benchmark's own client keeps asyncio's loop), so the loops are compared in the same run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time

BENCHMARKS = (
    "commit",
    "auth",
    "claim",
    "fairness",
    "http",
    "e2e",
    "retention",
    "fastpath",
    "streams",
    "events",
    "held",
    "keys",
)
# A benchmark whose module is named otherwise (bench/<module>.py).
MODULES = {"fastpath": "fast_path", "http": "http_client"}
LOOPS = ("asyncio", "uvloop")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run ({', '.join(BENCHMARKS)}); all when none is named",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument(
        "--loop",
        default="",
        metavar="LOOPS",
        help="comma-separated event loops (asyncio,uvloop) to run each benchmark's servers on",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    args.loops = [loop.strip() for loop in args.loop.split(",") if loop.strip()]
    if bad := [loop for loop in args.loops if loop not in LOOPS]:
        parser.error(f"unknown event loop(s): {', '.join(bad)} (choose from {', '.join(LOOPS)})")
    return args


def runs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(benchmark, event loop or None for the default) in the order to run them."""
    loops: list[str | None] = list(args.loops) or [None]
    return [(name, loop) for name in args.names or BENCHMARKS for loop in loops]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every child process and server is still stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    failed = []
    began = time.monotonic()
    for name, loop in runs(args):
        module = importlib.import_module(f"bench.{MODULES.get(name, name)}")
        if loop is not None:
            # The processes the benchmark starts inherit it (bench/services.py copies environ).
            os.environ["AGENTRUN_EVENT_LOOP"] = loop
            print(f"\n== {name} with AGENTRUN_EVENT_LOOP={loop}", flush=True)
            name = f"{name} ({loop})"
        started = time.monotonic()
        try:
            module.run(quick=args.quick)
            print(f"   ({name} took {time.monotonic() - started:.0f}s)", flush=True)
        except KeyboardInterrupt:
            print(f"\n!! {name} interrupted; its processes were stopped", file=sys.stderr)
            return 130
        except Exception as exc:  # noqa: BLE001 - report it and go on with the next benchmark
            print(f"\n!! {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
    took = time.monotonic() - began
    print(f"\n== total wall time: {took // 60:.0f} min {took % 60:.0f} s ==", flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
