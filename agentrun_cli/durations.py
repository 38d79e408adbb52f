"""Lengths of time, the one parser for every flag and file field that takes one.

Flags (`--every`, `--jitter`, `--deadline`, `--finish-within`, `--timeout`, `--grace`,
`--expires-in`, `--since`, ...) and agent files' durations (`limits.deadline`,
`limits.max_age`, `approval.expiry`) all read:

    90  1.5               a plain number: seconds (what the SECONDS flags always took)
    90s 15m 12h 30d 2w    a number and a unit (s, m, h, d, w; also sec, min, hours, ...)
    1d2h  1h30m  1.5h     several, and decimals (pytimeparse)
    1:30  1:02:03         clock style, mm:ss and hh:mm:ss (pytimeparse)
    PT1H  P1DT2H  PT0.5S  ISO 8601 (isodate); months and years are refused: they have no
                          fixed length

Refused, with the value named: empty, negative, NaN or infinite, more than a protobuf
Duration holds (10,000 years), and anything else. Both libraries are maintained parsers of
these forms; what is ours is only the plain number, the refusals and the range.
"""

from __future__ import annotations

import argparse
import math
from datetime import timedelta

import isodate
from pytimeparse import timeparse

# google.protobuf.Duration's range: 10,000 years.
MAX_SECONDS = 315_576_000_000
FORMS = "e.g. 90, 90s, 15m, 1.5h, 1d2h, 2w, PT1H"


class DurationError(ValueError):
    """A text that is not a length of time this parser takes; the message names it."""


def parse(text: str) -> float:
    """Seconds, >= 0 and within a Duration's range; raises DurationError naming `text`."""
    value = _seconds(text.strip())
    if value is None:
        raise DurationError(f"{text!r} is not a duration ({FORMS})")
    if not math.isfinite(value):
        raise DurationError(f"{text!r} is not a finite duration")
    if not 0 <= value <= MAX_SECONDS:
        raise DurationError(f"{text!r} must be between 0 and {MAX_SECONDS} seconds")
    return value


def _seconds(text: str) -> float | None:
    if not any(ch.isdigit() for ch in text):  # "", "soon", and isodate's lenient "PT"
        return None
    if text[0] in "+-0123456789." and text[-1] in "0123456789.":
        try:  # a plain number is seconds; "nan" and "inf" fail the first-character test
            return float(text)
        except ValueError:
            pass  # "1:30" and the like
    if text[0] in "Pp":
        try:
            found = isodate.parse_duration(text.upper())
        except (isodate.ISO8601Error, ValueError):
            return None
        if not isinstance(found, timedelta):  # an isodate.Duration: years or months
            raise DurationError(f"{text!r}: months and years have no fixed length in seconds")
        return found.total_seconds()
    found_seconds = timeparse.timeparse(text)
    return None if found_seconds is None else float(found_seconds)


def positive(text: str) -> float:
    """A duration above zero (an expiry, an age)."""
    value = parse(text)
    if value == 0:
        raise DurationError(f"{text!r} must be longer than zero")
    return value


def arg(text: str) -> float:
    """argparse `type=`: seconds; a bad value is a usage error naming the flag (exit 2)."""
    try:
        return parse(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_arg(text: str) -> float:
    """argparse `type=`: seconds above zero."""
    try:
        return positive(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def field(value: object, where: str) -> float:
    """A file's duration field: a number of seconds or a text this module parses; raises
    DurationError naming the field and the value."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DurationError(f"{where}: {value!r} is not a duration ({FORMS})")
    try:
        return parse(str(value))
    except DurationError as exc:
        raise DurationError(f"{where}: {exc}") from None
