"""Requests built from the service descriptors: hostile field values and undecodable bytes.

`methods()` lists every RPC of every agentrun service from the generated descriptors, so
a new RPC is fuzzed without touching the test. `Fuzzer(seed).message(descriptor)` fills
a message with random values that servers get wrong: NUL characters, invalid UUIDs,
huge and negative numbers, enum values out of range, oversized strings and deeply nested
JSON in JSON-bearing fields. `undecodable(descriptor, rng)` gives wire bytes no valid
message has (random bytes, truncated fields, invalid UTF-8 in a string field).

Every call passes `auth_metadata()`: the one place a test credential goes.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

from agentrun.v1 import (
    agent_pb2,
    approval_pb2,
    executor_pb2,
    run_pb2,
    session_pb2,
    trigger_pb2,
)

MODULES = (agent_pb2, run_pb2, executor_pb2, approval_pb2, trigger_pb2, session_pb2)


def auth_metadata() -> tuple[tuple[str, str], ...]:
    """The metadata every fuzzed call carries (a bearer key once every RPC requires one)."""
    return ()


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
        service=service, name=method.name, path=f"/{service}/{method.name}",
        request=method.input_type, response=method.output_type,
        client_streaming=method.client_streaming, server_streaming=method.server_streaming,
    )  # fmt: skip


def methods() -> list[Rpc]:
    """Every RPC of every service in the agentrun protos."""
    return [
        _rpc(method)
        for module in MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


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
                return rng.choice(('{"a": "\\u0000"}', "NaN", "[1, 2", "{}", '{"x": 1}', "null"))
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
        if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64,
                    FieldDescriptor.TYPE_SFIXED64):  # fmt: skip
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
        if field.is_repeated:
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


async def table_counts(conn: asyncpg.Connection) -> dict[str, int]:
    """Row counts of every table of the schema (the migrator's bookkeeping excluded)."""
    tables = await conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    counts = {}
    for row in tables:
        name = row["tablename"]
        if "migration" in name:
            continue
        counts[name] = await conn.fetchval(f'SELECT count(*) FROM "{name}"')
    return counts
