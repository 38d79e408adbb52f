"""Key-encryption keys behind a small interface, and the local key file that holds them.

A `Kms` wraps a data key (32 bytes) under its current key version and unwraps it under
whichever version wrapped it; the `context` (workspace, data key version) is bound as
associated data, so a wrapped key copied to another workspace's row does not unwrap. The
KMS's own keys never leave it.

Plugging in another KMS means implementing the Protocol; nothing else changes:

* AWS KMS / GCP Cloud KMS / Azure Key Vault: `wrap` is Encrypt (AWS: `KeyId` the key's alias,
  `EncryptionContext=context`; GCP: `additional_authenticated_data` = the canonical context
  bytes), `unwrap` is Decrypt with the same context; `key_version` is the key version the
  service reports (AWS returns the key ARN; GCP the CryptoKeyVersion name). `rotate` is the
  service's on-demand rotation (AWS RotateKeyOnDemand; GCP a new primary version): old
  versions keep decrypting, as this module's contract requires.
* Vault transit: `wrap` is `POST transit/encrypt/<key>` with `associated_data` (aes256-gcm96
  keys), the returned `vault:vN:…` prefix is the key version; `unwrap` is `transit/decrypt`;
  `rotate` is `transit/keys/<key>/rotate` (keep `min_decryption_version` at 1 until every
  data key is re-wrapped; transit's `rewrap` endpoint could replace unwrap + wrap there).

Those clients authenticate with the platform's workload identity; their credentials live in
the process environment, never in the database.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
FILE_KIND = "agentrun-local-kms"
_PREFIX = "local:"


class KmsError(Exception):
    """The KMS cannot wrap or unwrap (unknown version, wrong key file, tampered bytes).

    Messages name versions and paths, never key material.
    """


@dataclass(frozen=True)
class WrappedKey:
    """A data key as the KMS wrapped it: which KMS key version, and the opaque bytes."""

    key_version: str
    ciphertext: bytes = field(repr=False)


class Kms(Protocol):
    """What envelope encryption needs from a key management service."""

    @property
    def current_version(self) -> str:
        """The key version new wraps use."""
        ...

    async def wrap(self, plaintext_key: bytes, *, context: dict[str, str]) -> WrappedKey: ...

    async def unwrap(self, wrapped: WrappedKey, *, context: dict[str, str]) -> bytes: ...

    async def rotate(self) -> str:
        """Make a new current key version (old ones still unwrap); return it."""
        ...


def canonical_context(context: dict[str, str]) -> bytes:
    """The context as associated data: sorted, unambiguous, stable across releases."""
    return json.dumps(context, sort_keys=True, separators=(",", ":")).encode()


class LocalKms:
    """Key-encryption keys in a JSON key file (mode 0600) outside the database.

    The file holds every version ever made; the newest is current. Wrapping is AES-256-GCM
    under the current version: nonce (12 bytes) || ciphertext+tag, the context as associated
    data. A file written by another process (`agentrun kms rotate-kek`) is read again when it
    changes on disk, so a running server learns the new version without a restart.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._keys: dict[str, bytes] = {}
        self._current = ""
        self._mtime_ns = -1
        self._reload()

    def __repr__(self) -> str:
        return f"LocalKms({str(self.path)!r}, current={self._current!r})"

    @classmethod
    def create(cls, path: Path) -> LocalKms:
        """Write a new key file with a first version; refuse (KmsError) if one exists."""
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"kind": FILE_KIND, "keys": [_new_entry(1)]}
        try:
            _write_new(path, doc)
        except FileExistsError:
            raise KmsError(f"{path} already exists; not overwriting a key file") from None
        return cls(path)

    @classmethod
    def open(cls, path: Path, *, create_missing: bool) -> LocalKms:
        """The key file at `path`; created first if missing and `create_missing` (dev only)."""
        if create_missing and not path.exists():
            try:
                return cls.create(path)
            except KmsError:
                pass  # another process created it meanwhile: use theirs
        if not path.exists():
            raise KmsError(
                f"KMS key file {path} does not exist; create it with `agentrun kms init` "
                "(without it nothing sealed can be opened)"
            )
        return cls(path)

    @property
    def current_version(self) -> str:
        self._reload_if_changed()
        return self._current

    async def wrap(self, plaintext_key: bytes, *, context: dict[str, str]) -> WrappedKey:
        version = self.current_version
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = AESGCM(self._keys[version]).encrypt(nonce, plaintext_key, _aad(version, context))
        return WrappedKey(version, nonce + sealed)

    async def unwrap(self, wrapped: WrappedKey, *, context: dict[str, str]) -> bytes:
        if wrapped.key_version not in self._keys:
            self._reload_if_changed()
        key = self._keys.get(wrapped.key_version)
        if key is None:
            raise KmsError(f"key version {wrapped.key_version!r} is not in {self.path}")
        blob = wrapped.ciphertext
        try:
            return AESGCM(key).decrypt(
                blob[:NONCE_BYTES], blob[NONCE_BYTES:], _aad(wrapped.key_version, context)
            )
        except InvalidTag:
            raise KmsError(
                f"a data key wrapped under {wrapped.key_version!r} does not unwrap with "
                f"{self.path} in its context (another key file, another row, or tampered)"
            ) from None

    async def rotate(self) -> str:
        """Add a version to the key file (atomically, one rotating process at a time) and
        make it current."""
        await asyncio.to_thread(_add_version, self.path)
        self._reload()
        return self._current

    def _reload_if_changed(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError as exc:
            raise KmsError(f"cannot read KMS key file {self.path}: {exc.strerror}") from None
        if mtime != self._mtime_ns:
            self._reload()

    def _reload(self) -> None:
        doc = _read(self.path)
        keys = {f"{_PREFIX}{e['version']}": base64.b64decode(e["key"]) for e in doc["keys"]}
        if not keys or any(len(k) != KEY_BYTES for k in keys.values()):
            raise KmsError(f"{self.path}: every key must be {KEY_BYTES} bytes")
        self._keys = keys
        self._current = f"{_PREFIX}{max(e['version'] for e in doc['keys'])}"
        self._mtime_ns = self.path.stat().st_mtime_ns


def _aad(version: str, context: dict[str, str]) -> bytes:
    return version.encode() + b"\0" + canonical_context(context)


def _new_entry(version: int) -> dict[str, object]:
    key = base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()
    return {"version": version, "key": key, "created_at": datetime.now(UTC).isoformat()}


def _read(path: Path) -> dict:
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KmsError(f"KMS key file {path} is readable by others; chmod 600 it")
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise KmsError(f"cannot read KMS key file {path}: {exc.strerror}") from None
    except ValueError:
        raise KmsError(f"KMS key file {path} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != FILE_KIND or not doc.get("keys"):
        raise KmsError(f"{path} is not an agentrun local KMS key file")
    return doc


def _temp_file(path: Path, doc: dict) -> str:
    """`doc` written to a 0600 file next to `path`; returns its name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:  # mkstemp creates it 0600
        json.dump(doc, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _write_new(path: Path, doc: dict) -> None:
    """Create `path` with `doc` all at once; FileExistsError if it exists (never a torn file)."""
    tmp = _temp_file(path, doc)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)


def _add_version(path: Path) -> None:
    """Append a new newest version to the key file, under a lock file beside it."""
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = _read(path)
        newest = max(entry["version"] for entry in doc["keys"])
        doc["keys"].append(_new_entry(newest + 1))
        os.replace(_temp_file(path, doc), path)


def default_key_file() -> Path:
    """The dev key file: `$AGENTRUN_DATA_DIR/kms.json`, else `<repo>/.data/kms.json`."""
    data_dir = os.environ.get("AGENTRUN_DATA_DIR") or Path(__file__).resolve().parents[2] / ".data"
    return Path(data_dir) / "kms.json"


def configured(kind: str, key_file: str | None, *, release: str) -> Kms:
    """The KMS a server or the CLI is configured with (`AGENTRUN_KMS`, `AGENTRUN_KMS_KEY_FILE`).

    A key file named explicitly must exist (`agentrun kms init` makes one): a production
    server that silently made itself a new key would seal with a key nobody backed up. Only
    a dev release with no file named creates the default one on first use.
    """
    if kind != "local":
        raise KmsError(f"AGENTRUN_KMS={kind!r}: this build has only the 'local' KMS")
    if key_file:
        return LocalKms.open(Path(key_file), create_missing=False)
    if release != "dev":
        raise KmsError(
            "AGENTRUN_KMS_KEY_FILE is not set; outside a dev release the KMS key file must be "
            "named (create one with `agentrun kms init --key-file PATH`)"
        )
    return LocalKms.open(default_key_file(), create_missing=True)
