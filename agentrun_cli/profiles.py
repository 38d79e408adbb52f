"""The CLI's profiles are the client package's (agentrun_client/profiles.py): one file format,
one precedence, for `agentrun` and for programs using agentrun_client."""

from agentrun_client.profiles import (
    FIELDS,
    NAME,
    Profile,
    ProfileError,
    config_path,
    dumps,
    load,
    redact,
    save,
    select,
)

__all__ = [
    "FIELDS",
    "NAME",
    "Profile",
    "ProfileError",
    "config_path",
    "dumps",
    "load",
    "redact",
    "save",
    "select",
]
