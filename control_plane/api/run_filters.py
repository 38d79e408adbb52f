"""The checks of a run's tags and metadata at the API's edge (ground/run_labels.py says what
is allowed): StartRun's values, and ListRuns' and the bulk actions' filters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from ground import run_labels


def labels(
    tags: Sequence[str], metadata_json: str
) -> tuple[list[str] | None, dict[str, Any] | None]:
    """StartRun's tags and metadata, checked (ground/run_labels.py); None when unset."""
    try:
        checked = run_labels.tags(tags) or None
    except ValueError as exc:
        raise InvalidArgument("tags", str(exc)) from None
    meta = None
    if metadata_json:
        value = validate.json_value("metadata_json", metadata_json, max_bytes=64 * 1024)
        try:
            meta = run_labels.metadata(value) or None
        except ValueError as exc:
            raise InvalidArgument("metadata_json", str(exc)) from None
    return checked, meta


def label_filters(tag: str, metadata: str, where: str = "") -> tuple[str | None, str | None]:
    """ListRuns' tag and metadata filters: the tag, and the JSON object the run's metadata
    must contain (None when unset)."""
    try:
        wanted = run_labels.tag(tag) if tag else None
    except ValueError as exc:
        raise InvalidArgument(where + "tag", str(exc)) from None
    contains = None
    if metadata:
        try:
            key, value = run_labels.key_value(metadata)
        except ValueError as exc:
            raise InvalidArgument(where + "metadata", str(exc)) from None
        if "\x00" in value:
            raise InvalidArgument(where + "metadata", "contains a NUL character")
        contains = json.dumps({key: value})
    return wanted, contains
