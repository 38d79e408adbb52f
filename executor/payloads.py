"""Large tool results as payloads, and the `read_result` tool that reads them back.

A tool result whose output (as the model would read it: its JSON text) is over the
threshold is uploaded whole through `ExecutorService.PutPayloadChunk` (in chunks, on a
channel of its own, never on the Connect stream), and the step records a reference
(`"payload": {"sha256", "size", "media_type"}`) with a truncated view as its `output`:
the first bytes and a note on how to read more. The model reads exactly that view, now
and on every replay. `read_result(ref, offset, length)` reads a slice back through
`GetPayloadSlice`; its result is an ordinary tool_result, so replay reads the recorded
slice and never the payload.

The upload comes before the commit: a step never references a payload that is not whole.
A crash between the two leaves an unreferenced payload, which nothing reads; the retry
uploads the same bytes under the same name (SHA-256), which is acknowledged as stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

import faults
from agentrun.v1 import executor_pb2, executor_pb2_grpc
from executor.replay import RESULT, Entry
from executor.tools.delivery import Outcome
from executor.transport import ChannelSecurity, open_channel

READ_RESULT = "read_result"
MEDIA_TYPE = "application/json"
CHUNK_BYTES = 1024 * 1024
RETRY_START = 0.1
RETRY_CAP = 2.0
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class PayloadFenced(Exception):
    """The control plane refused the call: the run is no longer held under this lease."""


class PayloadRefused(Exception):
    """The control plane refused a payload call for another reason (a bug): the run fails."""


@dataclass(frozen=True)
class Limits:
    threshold_bytes: int = 64 * 1024  # outputs over this become payloads
    view_bytes: int = 8 * 1024  # how much of one the prompt shows
    read_max_bytes: int = 64 * 1024  # the most one read_result returns


def encode(output: Any) -> bytes:
    """The bytes of a payload: the output's JSON text, as the model would have read it."""
    return json.dumps(output, ensure_ascii=False).encode()


def reference(data: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "media_type": MEDIA_TYPE}


def view(data: bytes, sha256: str, limits: Limits) -> str:
    """The truncated view the model reads: the first bytes (whole characters only) and a note."""
    head = data[: limits.view_bytes].decode("utf-8", "ignore")
    shown = len(head.encode())
    return (
        f"{head}\n[truncated: this result is {len(data)} bytes; the first {shown} are shown. "
        f"The whole result is stored as payload {sha256}. Read more with "
        f'read_result(ref="{sha256}", offset={shown}, length=<at most {limits.read_max_bytes}>).]'
    )


def find(entries: Iterable[Entry], ref: str) -> Entry | None:
    """The tool_result of this run that `ref` names: by its payload's sha256, or by its seq."""
    for entry in entries:
        stored = entry.payload.get("payload") if entry.kind == RESULT else None
        if not isinstance(stored, Mapping):
            continue
        if ref == stored.get("sha256") or (ref.isdigit() and int(ref) == entry.seq):
            return entry
    return None


def read_arguments(arguments: Mapping[str, Any], cap: int) -> tuple[str, int, int] | str:
    """(ref, offset, length) of a read_result call, or why they cannot be read."""
    ref = str(arguments.get("ref", "")).strip()
    offset, length = arguments.get("offset", 0), arguments.get("length", cap)
    if not (_SHA256.match(ref) or ref.isdigit()):
        return "ref must be a payload's sha256 or the seq of a tool result"
    if not isinstance(offset, int) or offset < 0:
        return "offset must be a non-negative integer"
    if not isinstance(length, int) or length <= 0:
        return "length must be a positive integer"
    return ref, offset, min(length, cap)


def slice_output(sha256: str, offset: int, data: bytes, size: int) -> dict[str, Any]:
    """What read_result records: the slice's text and where it lies in the whole."""
    end = offset + len(data)
    return {
        "ref": sha256,
        "offset": offset,
        "length": len(data),
        "size": size,
        "text": data.decode("utf-8", "replace"),
        "more": end < size,
    }


def chunks(data: bytes, size: int = CHUNK_BYTES) -> list[tuple[int, bytes]]:
    return [(at, data[at : at + size]) for at in range(0, max(len(data), 1), size)]


class PayloadClient:
    """The unary payload RPCs, on a channel apart from the Connect stream."""

    def __init__(
        self,
        target: str,
        options: Sequence[tuple[str, int | str]],
        security: ChannelSecurity | None,
        credential: str,
    ) -> None:
        extra = security.options() if security else []
        creds = security.credentials() if security else None
        self._channel = open_channel(target, [*options, *extra], creds)
        self._stub = executor_pb2_grpc.ExecutorServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {credential}"),) if credential else ()

    async def put(self, lease: executor_pb2.Lease, data: bytes, ref: Mapping[str, Any]) -> None:
        for offset, chunk in chunks(data):
            request = executor_pb2.PutPayloadChunkRequest(
                lease=lease,
                sha256=ref["sha256"],
                size=len(data),
                media_type=ref["media_type"],
                offset=offset,
                data=chunk,
            )
            reply = await self._call(self._stub.PutPayloadChunk, request)
            if reply.complete:
                return

    async def get(
        self, lease: executor_pb2.Lease, sha256: str, offset: int, length: int
    ) -> executor_pb2.GetPayloadSliceResponse:
        request = executor_pb2.GetPayloadSliceRequest(
            lease=lease, sha256=sha256, offset=offset, length=length
        )
        return await self._call(self._stub.GetPayloadSlice, request)

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata, timeout=30)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                raise PayloadFenced(exc.details() or "lease lost") from None
            if code in _RETRIED or code == grpc.StatusCode.NOT_FOUND:
                raise
            raise PayloadRefused(f"{code.name}: {exc.details()}") from None

    async def aclose(self) -> None:
        await self._channel.close(grace=None)


class LargeResults:
    """What the run loop asks: store an output that is too large, read a slice back."""

    def __init__(self, client: PayloadClient, limits: Limits) -> None:
        self.client = client
        self.limits = limits

    async def store(
        self, lease: executor_pb2.Lease, output: Any, is_safe: Callable[[], bool]
    ) -> tuple[Any, dict[str, Any] | None]:
        """(output to record, its payload reference); the output as is when small enough."""
        data = encode(output)
        if len(data) <= self.limits.threshold_bytes:
            return output, None
        ref = reference(data)
        await _retrying(lambda: self.client.put(lease, data, ref), is_safe)
        faults.point("executor.payload.after_put")
        return view(data, ref["sha256"], self.limits), {"payload": ref}

    async def read(
        self,
        lease: executor_pb2.Lease,
        entries: Sequence[Entry],
        arguments: Mapping[str, Any],
        is_safe: Callable[[], bool],
    ) -> tuple[Outcome, str | None]:
        """The read_result outcome, and the untrusted origin of the result it reads from."""
        parsed = read_arguments(arguments, self.limits.read_max_bytes)
        if isinstance(parsed, str):
            return Outcome("error", error=parsed), None
        ref, offset, length = parsed
        entry = find(entries, ref)
        if entry is None:
            return Outcome("error", error=f"no stored result {ref!r} in this run"), None
        sha = str(entry.payload["payload"]["sha256"])
        try:
            got = await _retrying(lambda: self.client.get(lease, sha, offset, length), is_safe)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return Outcome("error", error=f"payload {sha} is not stored"), None
        origin = entry.payload.get("untrusted")
        output = slice_output(sha, offset, got.data, got.size)
        return Outcome("ok", output=output), str(origin) if origin else None


async def _retrying(call: Callable[[], Any], is_safe: Callable[[], bool]) -> Any:
    """Try again while the control plane is unreachable and the lease is safe."""
    delay = RETRY_START
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _RETRIED:
                raise
            if not is_safe():
                raise PayloadFenced("lease would lapse while payloads cannot be reached") from None
            await asyncio.sleep(delay)
            delay = min(RETRY_CAP, delay * 2)
