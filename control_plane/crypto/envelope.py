"""Per-workspace data keys, and sealing secrets with them (AES-256-GCM).

A sealed value is self-describing, so it opens after any number of rotations:

    format (1 byte, =1) | data key version (4 bytes, big-endian) | nonce (12 random bytes)
    | AES-256-GCM ciphertext and 16-byte tag

The associated data binds the header, the workspace, the purpose ("trigger_secret",
"connection_token") and the object id (the trigger and secret id, the connection id): a
sealed value copied to another workspace's, purpose's or object's row does not open.

Data keys are made on a workspace's first seal (32 random bytes), stored only wrapped by the
KMS (`workspace_data_keys`), and kept unwrapped in this process's memory for a short while
(bounded, with a TTL) so a webhook delivery costs no KMS call. Their reprs say nothing.

Rotation: `rotate_data_key(ws)` makes a new version that seals from then on (other replicas
pick it up when their cached "current version" lapses; until then they still seal with the
old one, which stays valid); `rotate_kek()` has the KMS make a new key version and re-wraps
every data key under it. Old ciphertexts are never re-encrypted: they name their data key
version, and every version keeps opening.
"""

from __future__ import annotations

import json
import secrets
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

import grpc
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from control_plane.crypto.kms import KEY_BYTES, NONCE_BYTES, Kms, KmsError, WrappedKey
from control_plane.ground.errors import DomainError
from control_plane.store import crypto as store
from control_plane.store.crypto import StoredDataKey
from control_plane.store.db import Pool

TRIGGER_SECRET = "trigger_secret"
CONNECTION_TOKEN = "connection_token"
# A notification channel's bot token, SMTP password or webhook signing secret (issue 43).
CHANNEL_SECRET = "channel_secret"
PURPOSES = frozenset({TRIGGER_SECRET, CONNECTION_TOKEN, CHANNEL_SECRET})

FORMAT = 1
_HEADER = struct.Struct(">BI")
_TAG_BYTES = 16
_AAD_LABEL = b"agentrun-seal\0"
K = TypeVar("K")
V = TypeVar("V")


class CannotOpen(DomainError):
    """A sealed value does not open: tampered, moved to another row, or its key is gone.

    Says which object and why in general terms; never the value or any key.
    """

    code = grpc.StatusCode.DATA_LOSS


class _DataKey:
    """An unwrapped data key; its repr (and so any log or traceback) shows no key bytes."""

    __slots__ = ("aead", "version", "workspace_id")

    def __init__(self, workspace_id: str, version: int, key: bytes) -> None:
        self.workspace_id = workspace_id
        self.version = version
        self.aead = AESGCM(key)

    def __repr__(self) -> str:
        return f"DataKey({self.workspace_id!r}, v{self.version}, <redacted>)"


class _KeyCache:
    """Unwrapped data keys by (workspace, version) and each workspace's current version,
    at most `size` of each, each for `ttl` seconds."""

    def __init__(self, ttl: float, size: int) -> None:
        self.ttl, self.size = ttl, size
        self._keys: OrderedDict[tuple[str, int], tuple[float, _DataKey]] = OrderedDict()
        self._current: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def key(self, workspace_id: str, version: int) -> _DataKey | None:
        return _fresh(self._keys, (workspace_id, version))

    def current(self, workspace_id: str) -> _DataKey | None:
        version = _fresh(self._current, workspace_id)
        return None if version is None else self.key(workspace_id, version)

    def put(self, key: _DataKey, *, current: bool = False) -> None:
        expires = time.monotonic() + self.ttl
        _put(self._keys, (key.workspace_id, key.version), (expires, key), self.size)
        if current:
            _put(self._current, key.workspace_id, (expires, key.version), self.size)

    def clear(self) -> None:
        self._keys.clear()
        self._current.clear()


def _fresh(cache: OrderedDict[K, tuple[float, V]], name: K) -> V | None:
    """The entry's value if present and not expired (then also most recently used)."""
    entry = cache.get(name)
    if entry is None:
        return None
    if entry[0] < time.monotonic():
        del cache[name]
        return None
    cache.move_to_end(name)
    return entry[1]


def _put(
    cache: OrderedDict[K, tuple[float, V]], name: K, entry: tuple[float, V], size: int
) -> None:
    cache[name] = entry
    cache.move_to_end(name)
    while len(cache) > size:
        cache.popitem(last=False)


def _aad(header: bytes, workspace_id: str, purpose: str, object_id: str) -> bytes:
    return header + _AAD_LABEL + json.dumps([workspace_id, purpose, object_id]).encode()


def _context(workspace_id: str, version: int) -> dict[str, str]:
    """What the KMS binds a data key's wrapping to."""
    return {"workspace_id": workspace_id, "data_key_version": str(version)}


@dataclass(frozen=True)
class Rewrapped:
    """What a KEK rotation did: the KMS key version now current, how many keys moved to it."""

    kms_key_version: str
    data_keys: int


class Envelope:
    """Seals and opens secrets with per-workspace data keys that `kms` wraps."""

    def __init__(self, pool: Pool, kms: Kms, *, cache_seconds: float = 300.0) -> None:
        self._pool = pool
        self.kms = kms
        self._cache = _KeyCache(cache_seconds, size=4096)

    def __repr__(self) -> str:
        return f"Envelope({self.kms!r})"

    async def seal(
        self, workspace_id: str, purpose: str, object_id: str, plaintext: bytes
    ) -> bytes:
        """`plaintext` encrypted under the workspace's current data key, bound to its row."""
        _check_purpose(purpose)
        key = await self._current_key(workspace_id)
        header = _HEADER.pack(FORMAT, key.version)
        nonce = secrets.token_bytes(NONCE_BYTES)
        aad = _aad(header, workspace_id, purpose, object_id)
        return header + nonce + key.aead.encrypt(nonce, plaintext, aad)

    async def open(self, workspace_id: str, purpose: str, object_id: str, sealed: bytes) -> bytes:
        """The plaintext `seal` was given; CannotOpen unless workspace, purpose and object
        are the ones it was sealed for and nothing was changed."""
        _check_purpose(purpose)
        what = f"{purpose} {object_id!r} of workspace {workspace_id!r}"
        if len(sealed) < _HEADER.size + NONCE_BYTES + _TAG_BYTES:
            raise CannotOpen(f"cannot open {what}: too short to be sealed")
        header = sealed[: _HEADER.size]
        fmt, version = _HEADER.unpack(header)
        if fmt != FORMAT:
            raise CannotOpen(f"cannot open {what}: unknown format {fmt}")
        key = await self._key(workspace_id, version, what)
        nonce = sealed[_HEADER.size : _HEADER.size + NONCE_BYTES]
        try:
            return key.aead.decrypt(
                nonce,
                sealed[_HEADER.size + NONCE_BYTES :],
                _aad(header, workspace_id, purpose, object_id),
            )
        except InvalidTag:
            raise CannotOpen(
                f"cannot open {what}: it was sealed for another workspace, purpose or object, "
                "or changed since"
            ) from None

    async def rotate_data_key(self, workspace_id: str) -> int:
        """A new data key version seals the workspace's secrets from now on; the new version.

        Raises LookupError for a workspace that does not exist."""

        async def wrap(version: int) -> tuple[str, bytes]:
            wrapped = await self.kms.wrap(
                secrets.token_bytes(KEY_BYTES), context=_context(workspace_id, version)
            )
            return wrapped.key_version, wrapped.ciphertext

        version = await store.add_next_version(self._pool, workspace_id, wrap)
        if version is None:
            raise LookupError(f"workspace {workspace_id!r} does not exist")
        self._cache.clear()
        return version

    async def rotate_kek(self) -> Rewrapped:
        """Have the KMS make a new key version, then re-wrap every data key under it."""
        await self.kms.rotate()
        return await self.rewrap()

    async def rewrap(self, batch: int = 100) -> Rewrapped:
        """Re-wrap every data key not under the KMS's current version (resumable, idempotent)."""
        target, moved = self.kms.current_version, 0
        while rows := await store.not_under(self._pool, target, batch):
            for row in rows:
                plain = await self._unwrap(row)
                wrapped = await self.kms.wrap(
                    plain, context=_context(row.workspace_id, row.version)
                )
                if wrapped.key_version != target:
                    raise KmsError(f"the KMS wrapped under {wrapped.key_version}, not {target}")
                moved += await store.rewrap(self._pool, row, target, wrapped.ciphertext)
        return Rewrapped(target, moved)

    def forget(self) -> None:
        """Drop every cached data key (the next seal or open asks the KMS again)."""
        self._cache.clear()

    async def _current_key(self, workspace_id: str) -> _DataKey:
        cached = self._cache.current(workspace_id)
        if cached is not None:
            return cached
        row = await store.current(self._pool, workspace_id)
        if row is None:
            fresh = await self.kms.wrap(
                secrets.token_bytes(KEY_BYTES), context=_context(workspace_id, 1)
            )
            await store.insert_first(self._pool, workspace_id, fresh.key_version, fresh.ciphertext)
            # Ours, or the one another replica stored first: the row decides.
            row = await store.current(self._pool, workspace_id)
            assert row is not None
        key = _DataKey(workspace_id, row.version, await self._unwrap(row))
        self._cache.put(key, current=True)
        return key

    async def _key(self, workspace_id: str, version: int, what: str) -> _DataKey:
        cached = self._cache.key(workspace_id, version)
        if cached is not None:
            return cached
        row = await store.get(self._pool, workspace_id, version)
        if row is None:
            raise CannotOpen(f"cannot open {what}: its data key (v{version}) does not exist")
        try:
            key = _DataKey(workspace_id, version, await self._unwrap(row))
        except KmsError as exc:
            raise CannotOpen(f"cannot open {what}: {exc}") from None
        self._cache.put(key)
        return key

    async def _unwrap(self, row: StoredDataKey) -> bytes:
        return await self.kms.unwrap(
            WrappedKey(row.kms_key_version, row.wrapped),
            context=_context(row.workspace_id, row.version),
        )


def _check_purpose(purpose: str) -> None:
    if purpose not in PURPOSES:
        raise ValueError(f"unknown sealing purpose {purpose!r}; add it to PURPOSES")
