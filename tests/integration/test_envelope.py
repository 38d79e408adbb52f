"""Envelope encryption against real Postgres and a real key file: what seals opens only
in its own workspace, purpose and object; rotations keep old rows readable; the database
alone holds nothing that opens anything."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from control_plane.crypto import kms
from control_plane.crypto.envelope import (
    CONNECTION_TOKEN,
    TRIGGER_SECRET,
    CannotOpen,
    Envelope,
    Rewrapped,
    _aad,
)
from control_plane.crypto.kms import KmsError, LocalKms, WrappedKey
from control_plane.store.db import create_pool

SECRET = b"whsec_the-plaintext-nobody-may-see-0123456789"
HEADER = 5  # format byte + 4-byte data key version
NONCE = 12


@pytest.fixture
async def pool(db_url, db):
    for ws in ("ws-a", "ws-b"):
        await db.execute("INSERT INTO workspaces (workspace_id) VALUES ($1)", ws)
    pool = await create_pool(db_url, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
def key_file(tmp_path):
    return LocalKms.create(tmp_path / "kms.json").path


@pytest.fixture
def envelope(pool, key_file):
    return Envelope(pool, LocalKms(key_file))


def data_key_version(sealed: bytes) -> int:
    return int.from_bytes(sealed[1:HEADER], "big")


async def test_sealed_value_opens_with_its_own_workspace_purpose_and_object(envelope):
    sealed = await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    assert SECRET not in sealed
    assert await envelope.open("ws-a", TRIGGER_SECRET, "hook/1", sealed) == SECRET
    # A fresh 96-bit nonce per seal: the same plaintext never seals to the same bytes.
    again = await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    assert again != sealed and again[HEADER : HEADER + NONCE] != sealed[HEADER : HEADER + NONCE]


@pytest.mark.parametrize(
    "workspace, purpose, object_id",
    [
        ("ws-b", TRIGGER_SECRET, "hook/1"),  # another workspace
        ("ws-a", CONNECTION_TOKEN, "hook/1"),  # another purpose
        ("ws-a", TRIGGER_SECRET, "hook/2"),  # another secret of the same trigger
        ("ws-a", TRIGGER_SECRET, "other/1"),  # another trigger
    ],
)
async def test_sealed_value_does_not_open_anywhere_else(envelope, workspace, purpose, object_id):
    sealed = await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    await envelope.seal("ws-b", TRIGGER_SECRET, "hook/1", b"ws-b has a data key of its own")
    with pytest.raises(CannotOpen) as refused:
        await envelope.open(workspace, purpose, object_id, sealed)
    assert SECRET.decode() not in str(refused.value)


@pytest.mark.parametrize("where", [0, 3, HEADER + 2, HEADER + NONCE + 1, -1])
async def test_a_changed_byte_anywhere_fails_to_open(envelope, where):
    sealed = bytearray(await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET))
    sealed[where] ^= 0x01
    with pytest.raises(CannotOpen):
        await envelope.open("ws-a", TRIGGER_SECRET, "hook/1", bytes(sealed))
    with pytest.raises(CannotOpen):
        await envelope.open("ws-a", TRIGGER_SECRET, "hook/1", bytes(sealed[:20]))


async def test_first_seals_on_two_replicas_at_once_agree_on_one_data_key(pool, key_file, db):
    replicas = [Envelope(pool, LocalKms(key_file)) for _ in range(2)]
    sealed = await asyncio.gather(
        *(r.seal("ws-a", TRIGGER_SECRET, f"hook/{i}", SECRET) for i, r in enumerate(replicas))
    )
    assert await db.fetchval("SELECT count(*) FROM workspace_data_keys") == 1
    for r in replicas:
        for i, s in enumerate(sealed):
            assert await r.open("ws-a", TRIGGER_SECRET, f"hook/{i}", s) == SECRET


async def test_kek_rotation_rewraps_data_keys_and_old_rows_still_open(pool, key_file, db):
    before = Envelope(pool, LocalKms(key_file))
    old = await before.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    await before.seal("ws-b", TRIGGER_SECRET, "hook/1", SECRET)
    wrapped_before = await db.fetch("SELECT wrapped FROM workspace_data_keys ORDER BY 1")

    done = await before.rotate_kek()

    assert done == Rewrapped("local:2", 2)
    rows = await db.fetch("SELECT kms_key_version, wrapped FROM workspace_data_keys ORDER BY 2")
    assert {r["kms_key_version"] for r in rows} == {"local:2"}
    assert {r["wrapped"] for r in rows}.isdisjoint({r["wrapped"] for r in wrapped_before})
    # A replica that never saw the old wrapping (nothing cached) opens the old row.
    after = Envelope(pool, LocalKms(key_file))
    assert await after.open("ws-a", TRIGGER_SECRET, "hook/1", old) == SECRET
    assert (await before.rewrap()).data_keys == 0  # idempotent: nothing left to move


async def test_old_kek_versions_still_unwrap_what_they_wrapped(pool, key_file, db):
    service = LocalKms(key_file)
    first = await Envelope(pool, service).seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    await service.rotate()  # new version, nothing re-wrapped (an interrupted rotation)
    assert await db.fetchval("SELECT kms_key_version FROM workspace_data_keys") == "local:1"
    fresh = Envelope(pool, LocalKms(key_file))
    assert await fresh.open("ws-a", TRIGGER_SECRET, "hook/1", first) == SECRET
    # New data keys are wrapped under the new version.
    await fresh.seal("ws-b", TRIGGER_SECRET, "hook/1", SECRET)
    assert (
        await db.fetchval(
            "SELECT kms_key_version FROM workspace_data_keys WHERE workspace_id = 'ws-b'"
        )
        == "local:2"
    )


async def test_data_key_rotation_seals_with_the_new_version_and_old_rows_still_open(
    pool, key_file, db
):
    envelope = Envelope(pool, LocalKms(key_file))
    old = await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    assert data_key_version(old) == 1

    assert await envelope.rotate_data_key("ws-a") == 2

    new = await envelope.seal("ws-a", TRIGGER_SECRET, "hook/2", SECRET)
    assert data_key_version(new) == 2
    keys = await db.fetch(
        "SELECT version, retired_at IS NOT NULL AS retired FROM workspace_data_keys "
        "WHERE workspace_id = 'ws-a' ORDER BY version"
    )
    assert [(k["version"], k["retired"]) for k in keys] == [(1, True), (2, False)]
    fresh = Envelope(pool, LocalKms(key_file))
    assert await fresh.open("ws-a", TRIGGER_SECRET, "hook/1", old) == SECRET
    assert await fresh.open("ws-a", TRIGGER_SECRET, "hook/2", new) == SECRET
    with pytest.raises(LookupError):
        await envelope.rotate_data_key("no-such-workspace")


async def test_the_database_holds_no_key_that_opens_anything(pool, key_file, tmp_path, db):
    envelope = Envelope(pool, LocalKms(key_file))
    sealed = await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    row = await db.fetchrow("SELECT * FROM workspace_data_keys WHERE workspace_id = 'ws-a'")
    # The real data key, unwrapped with the key file, opens the value...
    data_key = await LocalKms(key_file).unwrap(
        WrappedKey(row["kms_key_version"], row["wrapped"]),
        context={"workspace_id": "ws-a", "data_key_version": "1"},
    )
    assert opens_with(data_key, sealed)
    # ...and is nowhere in the row; no 32 bytes of the stored row open it either.
    assert data_key not in row["wrapped"]
    stored = row["wrapped"] + sealed
    assert not any(opens_with(stored[i : i + 32], sealed) for i in range(len(stored) - 31))
    # Another key file (another installation's, or a guess) opens nothing.
    stranger = Envelope(pool, LocalKms(LocalKms.create(tmp_path / "other.json").path))
    with pytest.raises(CannotOpen, match="does not unwrap"):
        await stranger.open("ws-a", TRIGGER_SECRET, "hook/1", sealed)


def opens_with(key: bytes, sealed: bytes) -> bool:
    """Whether `key` as a bare AES-256-GCM key decrypts `sealed` (sealed for ws-a hook/1)."""
    aad = _aad(sealed[:HEADER], "ws-a", TRIGGER_SECRET, "hook/1")
    try:
        AESGCM(key).decrypt(sealed[HEADER : HEADER + NONCE], sealed[HEADER + NONCE :], aad)
    except InvalidTag:
        return False
    return True


async def test_nothing_the_envelope_prints_shows_a_key(envelope, key_file):
    await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    cached = envelope._cache.current("ws-a")
    assert cached is not None and "redacted" in repr(cached)
    keys = [entry["key"] for entry in json.loads(key_file.read_text())["keys"]]
    shown = " ".join((repr(envelope), repr(envelope.kms), repr(cached)))
    assert keys and not any(k in shown or k[:16] in shown for k in keys)


def test_key_file_is_private_and_never_overwritten(tmp_path):
    made = LocalKms.create(tmp_path / "kms.json")
    assert stat.S_IMODE(os.stat(made.path).st_mode) == 0o600
    with pytest.raises(KmsError, match="already exists"):
        LocalKms.create(made.path)
    os.chmod(made.path, 0o644)
    with pytest.raises(KmsError, match="readable by others"):
        LocalKms(made.path)


def test_only_a_dev_release_without_a_named_file_creates_one(tmp_path, monkeypatch):
    missing = tmp_path / "missing.json"
    with pytest.raises(KmsError, match="does not exist"):
        kms.configured("local", str(missing), release="dev")
    assert not missing.exists()
    with pytest.raises(KmsError, match="AGENTRUN_KMS_KEY_FILE is not set"):
        kms.configured("local", None, release="2.1.0")
    with pytest.raises(KmsError, match="only the 'local' KMS"):
        kms.configured("aws", None, release="dev")
    monkeypatch.setenv("AGENTRUN_DATA_DIR", str(tmp_path / "data"))
    made = kms.configured("local", None, release="dev")
    assert made.current_version == "local:1" and (tmp_path / "data" / "kms.json").exists()


async def test_concurrent_data_key_rotations_each_get_their_own_version(pool, key_file, db):
    envelope = Envelope(pool, LocalKms(key_file))
    await envelope.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    versions = await asyncio.gather(*(envelope.rotate_data_key("ws-a") for _ in range(3)))
    assert sorted(versions) == [2, 3, 4]
    unretired = await db.fetch(
        "SELECT version FROM workspace_data_keys WHERE workspace_id = 'ws-a' AND retired_at IS NULL"
    )
    assert [r["version"] for r in unretired] == [4]


async def test_data_keys_are_served_from_memory_until_their_ttl(pool, key_file, db):
    cached = Envelope(pool, LocalKms(key_file), cache_seconds=600)
    uncached = Envelope(pool, LocalKms(key_file), cache_seconds=0)
    sealed = await cached.seal("ws-a", TRIGGER_SECRET, "hook/1", SECRET)
    assert await uncached.open("ws-a", TRIGGER_SECRET, "hook/1", sealed) == SECRET
    # The stored wrapping is ruined: only a replica that does not go back to it still opens.
    await db.execute("UPDATE workspace_data_keys SET wrapped = $1", bytes(60))
    assert await cached.open("ws-a", TRIGGER_SECRET, "hook/1", sealed) == SECRET
    with pytest.raises(CannotOpen, match="does not unwrap"):
        await uncached.open("ws-a", TRIGGER_SECRET, "hook/1", sealed)
    cached.forget()
    with pytest.raises(CannotOpen, match="does not unwrap"):
        await cached.open("ws-a", TRIGGER_SECRET, "hook/1", sealed)
