"""`agentrun profile set|list|show` and `agentrun dev-key`: where the CLI connects, as whom.

    agentrun profile set prod --address cp.acme.internal:443 --workspace acme \\
        --api-key-file ~/.secrets/agentrun-prod
    agentrun apikeys create --role operator --name ci-bot | agentrun profile set ci --api-key-stdin
    agentrun profile list
    agentrun profile show prod            # the key redacted: agr_ws_<id>_…
    export AGENTRUN_API_KEY=$(agentrun dev-key)    # the dev stack's admin key, for grpcurl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrun_cli import credentials, profiles, render, stack

SETTINGS = {
    "address": "control plane gRPC address",
    "workspace": "workspace id",
    "api_key_file": "a file holding the key (read at each use; keep it 0600)",
    "api_key_env": "an environment variable holding the key",
    "tls_ca": "PEM trust roots for the control plane's certificate",
    "tls_server_name": "the name its certificate carries, when not the address's host",
}


def _shown(profile: profiles.Profile) -> dict[str, str]:
    """The profile's settings with its key redacted; where the key comes from."""
    shown = profile.settings()
    if "api_key" in shown:
        shown["api_key"] = profiles.redact(shown["api_key"])
    elif profile.api_key_file or profile.api_key_env:
        try:
            shown["key"] = profiles.redact(profile.key())
        except profiles.ProfileError as exc:
            shown["key"] = f"unreadable ({exc})"
    return shown


def profile_set(args: argparse.Namespace) -> int:
    path = profiles.config_path()
    old = profiles.load(path).get(args.name) or profiles.Profile(name=args.name)
    changes = {k: getattr(args, k) for k in SETTINGS if getattr(args, k) is not None}
    if args.api_key_stdin:
        key = sys.stdin.readline().strip()
        if not key:
            raise profiles.ProfileError("--api-key-stdin: read no key from stdin")
        changes["api_key"] = key
    if {"api_key", "api_key_file", "api_key_env"} & set(changes):
        # One source of the key at a time: the new one replaces the others.
        changes = {"api_key": None, "api_key_file": None, "api_key_env": None, **changes}
    if changes.get("api_key_file"):
        changes["api_key_file"] = str(Path(changes["api_key_file"]).expanduser().resolve())
    settings = {**old.settings(), **{k: v or None for k, v in changes.items()}}
    new = profiles.Profile(name=args.name, **{k: v for k, v in settings.items() if v})
    written = profiles.save(new, path)
    print(f"profile {args.name} saved in {written} (mode 0600)")
    return 0


def profile_list(args: argparse.Namespace) -> int:
    every = profiles.load()
    if args.json:
        print(render.to_json({name: _shown(p) for name, p in every.items()}, indent=2))
        return 0
    if not every:
        print(f"no profiles in {profiles.config_path()}")
        return 0
    print(f"{'profile':<16} {'address':<28} {'workspace':<16} key")
    for name, p in sorted(every.items()):
        key = _shown(p).get("api_key") or _shown(p).get("key") or "-"
        print(f"{name:<16} {p.address or '-':<28} {p.workspace or '-':<16} {key}")
    return 0


def profile_show(args: argparse.Namespace) -> int:
    found = profiles.load()
    if args.name not in found:
        raise profiles.ProfileError(f"no profile {args.name!r} in {profiles.config_path()}")
    shown = _shown(found[args.name])
    if args.json:
        print(render.to_json({"profile": args.name, **shown}, indent=2))
    else:
        print(f"{'profile':<16} {args.name}")
        for k, v in shown.items():
            print(f"{k:<16} {v}")
    return 0


def dev_key(args: argparse.Namespace) -> int:
    """Print one key of the dev stack's credentials file (for grpcurl and scripts)."""
    data_dir = Path(args.data_dir) if args.data_dir else stack.default_data_dir()
    key = credentials.dev_credentials(data_dir).get(f"{args.role}_key")
    if not isinstance(key, str) or not key:
        print(
            f"error: no {args.role} key in {data_dir / credentials.FILE_NAME} "
            "(start `agentrun dev` first)",
            file=sys.stderr,
        )
        return 1
    print(key)
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "profile", help="named connection profiles (address, workspace, key, TLS)"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    # No `common` parent here: --address and --workspace are the profile's settings.
    p = actions.add_parser("set", help="create or change a profile")
    p.add_argument("name", metavar="NAME")
    for setting, text in SETTINGS.items():
        flag = "--" + setting.replace("_", "-")
        p.add_argument(flag, dest=setting, default=None, help=text)
    p.add_argument(
        "--api-key-stdin", action="store_true", help="read the key from stdin; kept in the file"
    )
    p.set_defaults(handler=profile_set)
    p = actions.add_parser("list", help="every profile, keys redacted", parents=[common])
    p.set_defaults(handler=profile_list)
    p = actions.add_parser("show", help="one profile, its key redacted", parents=[common])
    p.add_argument("name", metavar="NAME")
    p.set_defaults(handler=profile_show)
    p = sub.add_parser("dev-key", help="print a key of the dev stack (<data dir>/credentials.json)")
    p.add_argument(
        "--role", default="admin", choices=["admin", "operator", "approver", "platform", "executor"]
    )
    p.add_argument("--data-dir", help="the dev stack's data dir (env AGENTRUN_DATA_DIR)")
    p.set_defaults(handler=dev_key)
