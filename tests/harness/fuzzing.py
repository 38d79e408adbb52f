"""Requests built from the service descriptors: hostile field values and undecodable bytes.

`methods()` lists every RPC of every agentrun service from the generated descriptors, so
a new RPC is fuzzed without touching the test. `Fuzzer(seed).message(descriptor)` fills
a message with random values that servers get wrong: NUL characters, invalid UUIDs,
huge and negative numbers, enum values out of range, oversized strings and deeply nested
JSON in JSON-bearing fields. `undecodable(descriptor, rng)` gives wire bytes no valid
message has (random bytes, truncated fields, invalid UTF-8 in a string field).

`Callers.mint(db_url)` holds one credential of every kind (each role of workspace ws, an
executor, a platform admin); `callers.metadata(path, rng)` is one whose kind the method's
entry in `access.ACCESS` allows, so a new RPC is called with the right credential without
touching the test. `garbage_metadata(rng)` is a missing, malformed, unknown, forged or
revoked credential, which no method may serve.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

from control_plane.auth import access, keys
from control_plane.auth.principal import ROLES, Principal
from control_plane.auth.resolver import Resolver
from control_plane.server import SERVICE_NAMES
from control_plane.store import identity as store
from tests.harness import auth

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Rpc:
    service: str
    name: str
    path: str  # "/agentrun.v1.RunService/StartRun"
    request: Descriptor
    response: Descriptor
    client_streaming: bool
    server_streaming: bool

    def request_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.request)

    def response_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.response)


def _rpc(method: MethodDescriptor) -> Rpc:
    service = method.containing_service.full_name
    return Rpc(
        service=service,
        name=method.name,
        path=f"/{service}/{method.name}",
        request=method.input_type,
        response=method.output_type,
        client_streaming=method.client_streaming,
        server_streaming=method.server_streaming,
    )


def methods() -> list[Rpc]:
    """Every RPC of every agentrun service the control plane registers."""
    pool = descriptor_pool.Default()  # control_plane.server imported every *_pb2
    return [
        _rpc(method) for name in SERVICE_NAMES for method in pool.FindServiceByName(name).methods
    ]


# --- credentials ------------------------------------------------------------------------------


def _bearer(text: str) -> Metadata:
    return (("authorization", f"Bearer {text}"),)


class Callers:
    """One credential of every kind a caller can hold, each with the Principal it resolves to."""

    def __init__(self, texts: dict[str, str], principals: dict[str, Principal]) -> None:
        self.texts = texts
        self.principals = principals
        self.revoked = texts.pop("revoked")

    @classmethod
    async def mint(cls, db_url: str, workspace: str = "ws") -> Callers:
        texts = {
            role: await auth.workspace_key(db_url, workspace, role, principal=f"fuzz-{role}")
            for role in ROLES
        }
        texts["executor"] = await auth.executor_key(db_url)
        texts["platform"] = await auth.platform_key(db_url)
        revoked = await auth.workspace_key(db_url, workspace, principal="fuzz-revoked")
        conn = await asyncpg.connect(db_url)
        try:  # what the server's own resolver makes of each key
            resolver = Resolver(conn)
            principals = {n: await resolver.resolve(f"Bearer {t}") for n, t in texts.items()}
            parsed = keys.parse(revoked)
            assert parsed is not None
            await store.revoke_key(conn, parsed.key_id, workspace)
        finally:
            await conn.close()
        texts["revoked"] = revoked
        return cls(texts, principals)

    def allowed(self, path: str) -> list[str]:
        """The credentials whose kind the method's access-table entry admits."""
        need = access.ACCESS[path]
        return [name for name, who in self.principals.items() if access.allows(need, who)]

    def metadata(self, path: str, rng: random.Random | None = None) -> Metadata:
        """A credential the method admits (the first of them without `rng`)."""
        allowed = self.allowed(path)
        return _bearer(self.texts[rng.choice(allowed) if rng else allowed[0]])

    def garbage(self, rng: random.Random) -> Metadata:
        """A credential no method may serve: missing, malformed, unknown, forged, revoked."""
        real = rng.choice(list(self.texts.values()))
        forged = real[:-1] + ("A" if real[-1] != "A" else "B")
        unknown = keys.generate(rng.choice(("workspace", "executor", "platform"))).text
        choices: list[Metadata] = [
            (),
            (("authorization", ""),),
            (("authorization", "Bearer "),),
            (("authorization", f"Basic {real}"),),
            (("authorization", real),),
            _bearer("not-a-key"),
            _bearer("agr_ws_0123456789abcdef_short"),
            _bearer("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"),
            _bearer(unknown),
            _bearer(forged),
            _bearer(self.revoked),
        ]
        return rng.choice(choices)


# --- hostile values ---------------------------------------------------------------------------

_SLUGS = ("ws", "fuzz", "agent", "a", "-bad", "UPPER", "x" * 64, "")
_INTS = (0, 1, -1, 2**31 - 1, -(2**31), 7, 3600, 10**9)
_UINTS = (0, 1, 2**32 - 1, 2**63, 2**64 - 1, 7)


def nested_json(depth: int, rng: random.Random) -> str:
    if rng.random() < 0.5:
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


class Fuzzer:
    """Random messages for any descriptor, reproducible from the seed."""

    def __init__(self, seed: int, max_depth: int = 4) -> None:
        self.rng = random.Random(seed)
        self.max_depth = max_depth

    def text(self, field: FieldDescriptor) -> str:
        rng, name = self.rng, field.name
        roll = rng.random()
        # Mostly the seeded workspace and agent, so that requests get past the lookups.
        if name.endswith("workspace_id") and roll < 0.75:
            return "ws"
        if name.endswith("agent_id") and roll < 0.6:
            return "agent"
        if name.endswith("_json") or name in ("arguments", "payload"):
            if roll < 0.35:
                return nested_json(rng.choice((65, 500, 5000, 20_000)), rng)
            if roll < 0.6:
                return rng.choice(
                    (
                        '{"a": "\\u0000"}',
                        '{"a": "\\ud83d"}',
                        "NaN",
                        "[1, 2",
                        "{}",
                        '{"x": 1}',
                        "null",
                    )
                )
        return self._hostile_text(rng.random())

    def _hostile_text(self, roll: float) -> str:
        rng = self.rng
        if roll < 0.08:
            return rng.choice(_SLUGS) + "\x00" + rng.choice(("", "x", "tail"))
        if roll < 0.2:
            return str(uuid.uuid4()) if rng.random() < 0.8 else "not-a-uuid"
        if roll < 0.25:
            return rng.choice("ab\u00e9\u4e2d\U0001f600\x01") * rng.choice((300, 5000, 300_000))
        if roll < 0.35:
            return rng.choice(("0", "-1", "9" * 40, "1e999", " ", "\n", "'; DROP TABLE runs; --"))
        return rng.choice(_SLUGS)

    def scalar(self, field: FieldDescriptor) -> Any:
        rng, kind = self.rng, field.type
        if kind == FieldDescriptor.TYPE_STRING:
            return self.text(field)
        if kind == FieldDescriptor.TYPE_BYTES:
            return rng.randbytes(rng.choice((0, 1, 33, 5000)))
        if kind == FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if kind == FieldDescriptor.TYPE_ENUM:
            return rng.choice([*(v.number for v in field.enum_type.values), 99, -5, 2**31 - 1])
        if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return rng.choice((0.0, -1.5, 1e308, float("inf"), float("nan"), 3.25))
        if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
            return rng.choice(_UINTS[:3])
        if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
            return rng.choice(_UINTS)
        if kind in (
            FieldDescriptor.TYPE_INT64,
            FieldDescriptor.TYPE_SINT64,
            FieldDescriptor.TYPE_SFIXED64,
        ):
            return rng.choice((*_INTS, 2**63 - 1, -(2**63)))
        return rng.choice(_INTS)

    def fill(self, msg: Message, depth: int = 0) -> Message:
        rng = self.rng
        for field in msg.DESCRIPTOR.fields:
            if rng.random() < 0.35:
                continue
            self._set(msg, field, depth)
        return msg

    def _set(self, msg: Message, field: FieldDescriptor, depth: int) -> None:
        is_message = field.type == FieldDescriptor.TYPE_MESSAGE
        if is_message and depth >= self.max_depth:
            return
        target = getattr(msg, field.name)
        if is_message and field.message_type.GetOptions().map_entry:
            self._map(target, field)
        elif field.is_repeated:
            # Many items only at the top: 40 of 40 of 40 nested messages would be millions.
            for _ in range(self.rng.choice((1, 2, 3, 40) if depth == 0 else (1, 2))):
                if is_message:
                    self.fill(target.add(), depth + 1)
                else:
                    target.append(self.scalar(field))
        elif is_message:
            self._message_field(target, field, depth)
        else:
            setattr(msg, field.name, self.scalar(field))

    def _map(self, target: Any, field: FieldDescriptor) -> None:
        """A map field (AgentSpec.connections, ImportOpenApiRequest.classes): a few entries."""
        key, value = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        for _ in range(self.rng.choice((1, 2, 3))):
            if value.type == FieldDescriptor.TYPE_MESSAGE:  # map<string, WriteClass>
                self.fill(target[self.scalar(key)], 1)
            else:
                target[self.scalar(key)] = self.scalar(value)

    def _message_field(self, target: Message, field: FieldDescriptor, depth: int) -> None:
        name = field.message_type.full_name
        if name == "google.protobuf.Timestamp":
            target.seconds = self.rng.choice((0, -62135596800, 253402300799, 1_700_000_000))
        elif name == "google.protobuf.Duration":
            target.seconds = self.rng.choice((0, -5, 1, 3600, 315576000000))
        else:
            self.fill(target, depth + 1)
            target.SetInParent()

    def message(self, descriptor: Descriptor) -> Message:
        return self.fill(message_factory.GetMessageClass(descriptor)())


# --- undecodable bytes ------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string_fields(descriptor: Descriptor) -> list[FieldDescriptor]:
    return [f for f in descriptor.fields if f.type == FieldDescriptor.TYPE_STRING]


def undecodable(descriptor: Descriptor, rng: random.Random) -> bytes:
    """Wire bytes that are not a valid message of this type."""
    strings = _string_fields(descriptor)
    roll = rng.random()
    if strings and roll < 0.5:  # a string field holding bytes that are not UTF-8
        field = rng.choice(strings)
        bad = rng.choice((b"\xff", b"\xc3\x28", b"ok\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"))
        return _varint(field.number << 3 | 2) + _varint(len(bad)) + bad
    if roll < 0.7:  # a length-delimited field that claims more bytes than follow
        return _varint(1 << 3 | 2) + _varint(1000) + b"short"
    if roll < 0.8:  # a wire type that does not exist (6)
        return _varint(1 << 3 | 6) + b"\x01"
    return bytes([rng.choice((0x0A, 0x12, 0xFF, 0x07))]) + rng.randbytes(rng.randint(1, 64))


def invalid_variants(descriptor: Descriptor) -> Iterator[bytes]:
    """The fixed undecodable inputs every method is sent (besides the random ones)."""
    yield b"\xff\xff\xff\xff"
    yield b"\x0a\xff\xff\xff\xff\x0f"
    for field in _string_fields(descriptor):
        yield _varint(field.number << 3 | 2) + b"\x01\xff"


# --- what was written -------------------------------------------------------------------------

SNAPSHOT = "pg_current_snapshot()::text"


async def table_counts(conn: asyncpg.Connection) -> dict[str, int]:
    """Row counts of every table of the schema (the migrator's bookkeeping excluded), in
    one statement."""
    return (await _counts_and_snapshot(conn))[0]


async def _counts_and_snapshot(conn: asyncpg.Connection) -> tuple[dict[str, int], str]:
    """table_counts and the snapshot they were counted in (one statement, one snapshot)."""
    tables = [
        row["tablename"]
        for row in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
        if "migration" not in row["tablename"]
    ]
    # One row (t NULL) holds the snapshot: one statement sees one snapshot throughout.
    counts = (f"SELECT '{t}', count(*), NULL FROM \"{t}\"" for t in tables)
    first = f"SELECT NULL AS t, NULL::bigint AS n, {SNAPSHOT} AS snapshot"
    rows = await conn.fetch(" UNION ALL ".join([first, *counts]))
    (snapshot,) = (row["snapshot"] for row in rows if row["t"] is None)
    return {row["t"]: row["n"] for row in rows if row["t"] is not None}, snapshot


class TableCounts:
    """table_counts, read after every call of the fuzz test (tens of thousands of times),
    recounted only when some transaction has committed since the last count.

    Under MVCC two equal snapshots (xmin:xmax:in-progress ids) see the same committed rows,
    and every write takes a transaction id, whose commit changes the snapshot: an equal
    snapshot means the counts are what they were, and one cheap query tells.
    """

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.snapshot: str | None = None
        self.counts: dict[str, int] = {}
        self.recounted = 0

    async def now(self) -> dict[str, int]:
        unchanged = self.snapshot is not None and self.snapshot == await self.conn.fetchval(
            f"SELECT {SNAPSHOT}"
        )
        if unchanged:
            return self.counts
        self.counts, self.snapshot = await _counts_and_snapshot(self.conn)
        self.recounted += 1
        return self.counts
