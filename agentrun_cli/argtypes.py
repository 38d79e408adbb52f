"""Argument types for numbers the CLI puts into request fields.

argparse's `type=int` takes any whole number and `type=float` any float, "nan" and "inf"
included; the request's field then refuses it with a traceback (protobuf's "Value out of
range", Duration's "cannot convert float NaN to integer"). These refuse it at parsing, as
a usage error naming the option (exit 2), and leave the value's meaning (a priority's
-100..100, a limit's maximum) to the server, which names the field it refuses.
"""

from __future__ import annotations

import argparse
import math

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def _whole(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{value} is out of range ({low}..{high})")
    return value


def int32(text: str) -> int:
    """A whole number for an int32 field (counts, limits, seqs, versions, priorities)."""
    return _whole(text, *INT32)


def int64(text: str) -> int:
    """A whole number for an int64 field."""
    return _whole(text, *INT64)


def finite(text: str) -> float:
    """A number, not NaN or infinite (a temperature)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value
