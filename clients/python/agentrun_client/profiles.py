"""Named connection profiles, the way the Temporal CLI's environment profiles work; the
`agentrun` CLI and agentrun_client read the same file (the CLI's `profile set` writes it:
agentrun_cli/profiles.py).

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
