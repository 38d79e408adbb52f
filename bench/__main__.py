"""`python -m bench [commit|auth|claim|fairness|e2e|retention ...] [--quick]`: run them in order and print."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

BENCHMARKS = ("commit", "auth", "claim", "fairness", "e2e", "retention")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help=f"benchmarks to run ({', '.join(BENCHMARKS)}); all when none is named",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every child process and server is still stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    failed = []
    for name in args.names or BENCHMARKS:
        module = importlib.import_module(f"bench.{name}")
        try:
            module.run(quick=args.quick)
        except KeyboardInterrupt:
            print(f"\n!! {name} interrupted; its processes were stopped", file=sys.stderr)
            return 130
        except Exception as exc:  # noqa: BLE001 - report it and go on with the next benchmark
            print(f"\n!! {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
