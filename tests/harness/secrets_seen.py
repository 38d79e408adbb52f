"""Every credential the test run hands out, so the run's outputs can be searched for them.

The harness records each API key it mints and each ID token it fetches; at the end of the
session `leaks(root)` searches every log file the run's processes wrote (control planes,
executors, sandboxes, dev stacks) for them. A credential in a log line is a failure of the
whole run, whichever test caused it.
"""

from __future__ import annotations

from pathlib import Path

_SECRETS: set[str] = set()


def remember(secret: str) -> str:
    """Record a credential the run handed out; returns it."""
    if secret:
        _SECRETS.add(secret)
    return secret


def leaks(root: Path) -> list[str]:
    """`file: credential prefix…` for every log file under `root` holding a handed-out one."""
    found: list[str] = []
    for path in sorted(root.rglob("*.log")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        # Only the secret part of a key matters: its public id may be logged.
        found += [f"{path}: {s[:12]}…" for s in _SECRETS if _secret_part(s) in text]
    return found


def _secret_part(credential: str) -> str:
    # agr_<kind>_<key id>_<secret>: kind and id hold no "_", the secret may.
    return credential.split("_", 3)[3] if credential.startswith("agr_") else credential


def count() -> int:
    return len(_SECRETS)
