"""Named connection profiles: read by the client package (agentrun_client/profiles.py), one
file format and one precedence for `agentrun` and for programs using agentrun_client; written
here, by `agentrun profile set`, editing the file in place with tomlkit (a user's comments,
layout and other tables stay as they were)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import tomlkit
from tomlkit.items import AbstractTable

from agentrun_client.profiles import (
    FIELDS,
    NAME,
    Profile,
    ProfileError,
    config_path,
    load,
    redact,
    select,
)

__all__ = [
    "FIELDS",
    "NAME",
    "Profile",
    "ProfileError",
    "config_path",
    "load",
    "redact",
    "save",
    "select",
]


def save(profile: Profile, path: Path | None = None) -> Path:
    """Add or change `profile` in the file, written mode 0600 (it may hold a key).

    The file is edited, not rewritten: tomlkit keeps the user's comments, layout, other
    profiles and any other tables as they were; only this profile's settings change.
    """
    if not NAME.match(profile.name):
        raise ProfileError(f"profile name {profile.name!r}: use letters, digits, _ and -")
    path = path or config_path()
    load(path)  # refuse to edit a file the CLI cannot read (it names what is wrong)
    try:
        doc = tomlkit.parse(path.read_text())
    except FileNotFoundError:
        doc = tomlkit.document()
        doc.add(tomlkit.comment("agentrun CLI profiles (agentrun profile set/list/show)"))
    text = tomlkit.dumps(_edited(doc, profile))
    try:  # never replace a readable file with one the next command cannot read
        tomllib.loads(text.encode().decode())
    except (UnicodeError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"profile {profile.name!r}: a value cannot be saved ({exc})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def _edited(doc: tomlkit.TOMLDocument, profile: Profile) -> tomlkit.TOMLDocument:
    """`doc` with [profile.NAME] holding exactly `profile`'s settings, each kept in place."""
    if "profile" not in doc:
        doc.add(tomlkit.nl())
        doc["profile"] = tomlkit.table(is_super_table=True)
    tables = doc["profile"]
    assert isinstance(tables, AbstractTable)  # load() refused any other shape
    table = tables.get(profile.name)
    new = table is None
    if new:
        table = tomlkit.table()
    assert isinstance(table, AbstractTable)
    settings = profile.settings()
    for key in FIELDS:  # an existing key is changed in place, keeping its comment
        if key in settings:
            table[key] = settings[key]
        elif key in table:
            del table[key]
    if new:  # after the last profile, a blank line after it
        table.add(tomlkit.nl())
        tables[profile.name] = table
    return doc
