"""`agentrun kms init|status|rotate-kek|rewrap|rotate-data-key`: the envelope encryption keys.

    agentrun kms init --key-file /etc/agentrun/kms.json   # a new local KMS key file (0600)
    agentrun kms rotate-kek                               # new KMS key version; re-wrap data keys
    agentrun kms rotate-data-key --workspace acme         # new data key for acme's new seals
    agentrun kms status

They act on the database directly (DATABASE_URL) with the KMS the server uses
(AGENTRUN_KMS, AGENTRUN_KMS_KEY_FILE; a dev release with neither uses <data dir>/kms.json). A
running server picks up a rotated key file by itself; nothing needs a restart, and nothing
sealed is re-encrypted: old key versions keep opening what they sealed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from agentrun_cli.stack import redact

# The control plane's modules load only when a `kms` command runs (as `migrate` does), so
# every other command starts without asyncpg and the crypto stack.


def _key_file(args: argparse.Namespace) -> str | None:
    return args.key_file or os.environ.get("AGENTRUN_KMS_KEY_FILE") or None


async def _with_envelope(args: argparse.Namespace, action: str) -> int:
    from control_plane.crypto import kms
    from control_plane.crypto.envelope import Envelope
    from control_plane.store import crypto as key_store
    from control_plane.store.db import create_pool

    url = os.environ.get("DATABASE_URL")
    if not url:
        raise LookupError("DATABASE_URL is not set: say which database's data keys to use")
    service = kms.configured(
        os.environ.get("AGENTRUN_KMS", "local"),
        _key_file(args),
        release=os.environ.get("AGENTRUN_RELEASE", "dev"),
    )
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        envelope = Envelope(pool, service)
        if action == "rotate-kek":
            done = await envelope.rotate_kek()
            print(
                f"KMS key version now {done.kms_key_version}; re-wrapped {done.data_keys} "
                f"data key(s) in {redact(url)}"
            )
        elif action == "rewrap":
            done = await envelope.rewrap()
            print(f"re-wrapped {done.data_keys} data key(s) under {done.kms_key_version}")
        elif action == "rotate-data-key":
            version = await envelope.rotate_data_key(args.workspace)
            print(f"workspace {args.workspace}: data key v{version} seals from now on")
        else:
            print(f"KMS {service!r}; current key version {service.current_version}")
            for row in await key_store.summary(pool):
                print(
                    f"  {row['kms_key_version']}: {row['data_keys']} data key(s), "
                    f"{row['workspaces']} workspace(s)"
                )
        return 0
    finally:
        await pool.close()


def _run(args: argparse.Namespace) -> int:
    from control_plane.crypto import kms

    try:
        if args.action == "init":
            return _init(args)
        return asyncio.run(_with_envelope(args, args.action))
    except (kms.KmsError, LookupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _init(args: argparse.Namespace) -> int:
    from control_plane.crypto import kms

    path = Path(_key_file(args) or kms.default_key_file())
    created = kms.LocalKms.create(path)
    print(f"created {path} (mode 0600) with key version {created.current_version}; back it up")
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "kms", help="envelope encryption keys: KMS key file, rotation"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    helps = {
        "init": "create a local KMS key file (refuses to overwrite one)",
        "status": "the KMS's current key version and what each version wraps",
        "rotate-kek": "new KMS key version; re-wrap every data key under it",
        "rewrap": "finish an interrupted rotate-kek (re-wrap what is not under the current)",
        "rotate-data-key": "new data key for the workspace's new seals (--workspace)",
    }
    for action, text in helps.items():
        p = actions.add_parser(action, help=text, parents=[common])
        p.add_argument(
            "--key-file", help="local KMS key file (env AGENTRUN_KMS_KEY_FILE; dev default)"
        )
        p.set_defaults(handler=_run)
