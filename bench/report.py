"""Printing results: aligned tables, latency rows, and targets with whether they were met."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.stats import Summary

LATENCY_HEADERS = ("", "n", "p50 ms", "p99 ms", "mean ms")


def heading(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def note(text: str) -> None:
    print(f"   {text}", flush=True)


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.3f}"


def latency_row(label: str, s: Summary) -> list[str]:
    return [label, str(s.n), ms(s.p50), ms(s.p99), ms(s.mean)]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print rows under headers; the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in (headers, *rows)) for i in range(len(headers))]
    for row in (headers, *rows):
        cells = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("   " + "  ".join(cells), flush=True)


def target(label: str, value: float, goal: str, met: bool, unit: str = "x") -> None:
    """One ratio against its target, e.g. `commit p50 ours/raw  1.62x  target <= 2x  MET`
    (`unit`: what follows the value, for a figure that is no ratio, e.g. " KiB")."""
    shown = "n/a" if math.isnan(value) else f"{value:.2f}{unit}"
    verdict = "n/a" if math.isnan(value) else ("MET" if met else "NOT MET")
    print(f"   {label:<34} {shown:>9}   target {goal:<8} {verdict}", flush=True)
