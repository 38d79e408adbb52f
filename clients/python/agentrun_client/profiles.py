"""Named connection profiles, the way the Temporal CLI's environment profiles work; the
`agentrun` CLI and agentrun_client read the same file.

    agentrun profile set prod --address cp.acme.internal:443 --workspace acme \\
        --api-key-file ~/.secrets/agentrun-prod --tls-ca /etc/ssl/acme-ca.pem
    agentrun --profile prod runs list          # or AGENTRUN_PROFILE=prod

The file is TOML (`~/.config/agentrun/config.toml`, or AGENTRUN_CONFIG), written
mode 0600, one table a profile:

    [profile.prod]
    address = "cp.acme.internal:443"
    workspace = "acme"
    api_key_file = "/home/ada/.secrets/agentrun-prod"   # or api_key = "...", api_key_env = "VAR"
    tls_ca = "/etc/ssl/acme-ca.pem"
    tls_server_name = "cp.acme.internal"

Precedence, for each setting: a flag (`--address`, `--workspace`) > the environment
(AGENTRUN_ADDRESS, AGENTRUN_WORKSPACE, AGENTRUN_API_KEY, AGENTRUN_TLS_CA,
AGENTRUN_TLS_SERVER_NAME) > the profile > the dev stack's `.data/credentials.json`
and the defaults. With no profile named, a profile called `default` is used when
the file has one. A key is never printed: listings show `agr_ws_<id>_…`.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

FIELDS = (
    "address",
    "workspace",
    "api_key",
    "api_key_file",
    "api_key_env",
    "tls_ca",
    "tls_server_name",
)
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEY = re.compile(r"^(agr_(?:ws|ex|pa)_[a-z0-9]{16}_)\S+$")


class ProfileError(Exception):
    """A profile that cannot be used: not in the file, unreadable, or its key is missing."""


@dataclass(frozen=True)
class Profile:
    name: str
    address: str | None = None
    workspace: str | None = None
    api_key: str | None = None
    api_key_file: str | None = None
    api_key_env: str | None = None
    tls_ca: str | None = None
    tls_server_name: str | None = None

    def __repr__(self) -> str:  # never print the key by accident
        return f"Profile(name={self.name!r}, address={self.address!r})"

    def key(self) -> str | None:
        """The key this profile names: inline, from its file, or from its variable."""
        if self.api_key:
            return self.api_key
        if self.api_key_file:
            try:
                text = Path(self.api_key_file).expanduser().read_text().strip()
            except OSError as exc:
                raise ProfileError(
                    f"profile {self.name}: cannot read api_key_file {self.api_key_file}: "
                    f"{exc.strerror}"
                ) from None
            return text or None
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or None
        return None

    def settings(self) -> dict[str, str]:
        """The fields that are set, for writing and showing (the inline key included)."""
        return {
            f.name: v for f in fields(self) if f.name != "name" and (v := getattr(self, f.name))
        }


def redact(key: str | None) -> str:
    """`agr_ws_0123456789abcdef_…`: the key's public id, never its secret."""
    if not key:
        return "-"
    found = _KEY.match(key)
    return found.group(1) + "…" if found else f"… ({len(key)} characters, not an agentrun key)"


def config_path() -> Path:
    if path := os.environ.get("AGENTRUN_CONFIG"):
        return Path(path).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "agentrun" / "config.toml"


def load(path: Path | None = None) -> dict[str, Profile]:
    """Every profile in the config file ({} when there is no file)."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"{path}: {exc}") from None
    tables = data.get("profile", {})
    if not isinstance(tables, dict):
        raise ProfileError(f"{path}: [profile] must hold one table a profile")
    return {name: _profile(path, name, table) for name, table in tables.items()}


def _profile(path: Path, name: str, table: Any) -> Profile:
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: profile.{name} is not a table")
    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        raise ProfileError(f"{path}: profile.{name}: unknown setting(s) {', '.join(unknown)}")
    bad = [k for k, v in table.items() if not isinstance(v, str)]
    if bad:
        raise ProfileError(f"{path}: profile.{name}: {', '.join(bad)} must be strings")
    return Profile(name=name, **table)


def select(name: str | None, path: Path | None = None) -> Profile | None:
    """The profile named (by flag or AGENTRUN_PROFILE), else `default` if present, else None."""
    name = name or os.environ.get("AGENTRUN_PROFILE") or None
    found = load(path)
    if name is None:
        return found.get("default")
    if name not in found:
        raise ProfileError(f"no profile {name!r} in {path or config_path()}")
    return found[name]


def save(profile: Profile, path: Path | None = None) -> Path:
    """Add or replace `profile` in the file, written mode 0600 (it may hold a key)."""
    if not NAME.match(profile.name):
        raise ProfileError(f"profile name {profile.name!r}: use letters, digits, _ and -")
    path = path or config_path()
    every = load(path)
    every[profile.name] = profile
    text = dumps(every)
    try:  # never replace a readable file with one the next command cannot read
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {profile.name!r}: a value cannot be saved ({exc})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def dumps(every: dict[str, Profile]) -> str:
    """TOML text for the profiles (strings only; JSON string escapes are valid TOML)."""
    out = ["# agentrun CLI profiles (agentrun profile set/list/show)"]
    for name in sorted(every):
        out.append(f"\n[profile.{name}]")
        out += [f"{k} = {json.dumps(v)}" for k, v in every[name].settings().items()]
    return "\n".join(out) + "\n"
