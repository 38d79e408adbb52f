"""Request validation: every refusal names the field and what is wrong with it."""

from __future__ import annotations

import re
import uuid

from control_plane.errors import InvalidArgument

_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def slug(field: str, value: str) -> str:
    """A workspace or agent id: lowercase letters, digits, '-' and '_', 1-63 chars."""
    if not value:
        raise InvalidArgument(field, "is required")
    if not _ID.match(value):
        raise InvalidArgument(
            field, "must be 1-63 lowercase letters, digits, '-' or '_', starting alphanumeric"
        )
    return value


def run_id(field: str, value: str) -> uuid.UUID:
    if not value:
        raise InvalidArgument(field, "is required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"is not a UUID: {value[:64]!r}") from None


def text(field: str, value: str, *, max_bytes: int, required: bool = False) -> str:
    if required and not value:
        raise InvalidArgument(field, "is required")
    size = len(value.encode())
    if size > max_bytes:
        raise InvalidArgument(field, f"is {size} bytes; the limit is {max_bytes}")
    return value


def in_range(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be between {low} and {high}, got {value}")
    return value


def non_negative(field: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(field, f"must not be negative, got {value}")
    return value
