"""Latency summaries: percentiles, mean, and ratios of two summaries."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Summary:
    """Latency figures of one series of samples, in seconds."""

    n: int
    p50: float
    p99: float
    mean: float
    # A server's CPU seconds per sample, when the series measured it (bench/commit.py).
    cpu: float = math.nan

    @classmethod
    def of(cls, samples: list[float]) -> Summary:
        mean = statistics.fmean(samples) if samples else math.nan
        return cls(len(samples), percentile(samples, 50), percentile(samples, 99), mean)


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs, or nan when theirs is zero."""
    return ours / theirs if theirs else math.nan
