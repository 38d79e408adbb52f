"""What agent files and tool files (agent_files.py, tool_files.py) share: the error that names
the file, and the check that names every key a proto message does not have, with the nearest
known one, so a typo is never saved as a spec that silently lacks a field."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

# A message's fields that a file names otherwise: {message: {key in the file: field}}.
Aliases = Mapping[Descriptor, Mapping[str, str]]


class SpecFileError(ValueError):
    """An agent or tool file that cannot be read; the message names the file and what is wrong."""


def read_text(path: str) -> str:
    """A file named on the command line (`-`: standard input) as UTF-8 text; a file that is
    not text is a SpecFileError naming it and the first byte that is not UTF-8."""
    raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        where = "standard input" if path == "-" else path
        raise SpecFileError(
            f"{where}: not UTF-8 text (byte {err.start} is 0x{raw[err.start]:02x})"
        ) from None


def unknown_keys(
    value: dict[str, Any],
    message: Descriptor,
    extra: Collection[str] = (),
    at: str = "",
    aliases: Aliases | None = None,
) -> list[str]:
    """Every key under `value` that `message` (recursively) does not have, with a suggestion."""
    own = aliases.get(message, {}) if aliases else {}
    found = []
    for key, item in value.items():
        field = message.fields_by_name.get(own.get(key, key))
        if field is None:
            known = [*message.fields_by_name, *extra, *own]
            near = difflib.get_close_matches(str(key), known, n=1)
            found.append(f"{at}{key}" + (f" (did you mean {at}{near[0]}?)" if near else ""))
        elif _is_message(field) and not _is_map(field):
            found += _nested(item, field, f"{at}{key}", aliases)
    return found


def _nested(item: Any, field: FieldDescriptor, at: str, aliases: Aliases | None) -> list[str]:
    items = item if isinstance(item, list) else [item]
    found = []
    for i, sub in enumerate(items):
        if isinstance(sub, dict):
            where = f"{at}[{i}]." if isinstance(item, list) else f"{at}."
            assert field.message_type is not None
            found += unknown_keys(sub, field.message_type, at=where, aliases=aliases)
    return found


def _is_message(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry
