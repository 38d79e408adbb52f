"""ExecutorService's payload RPCs: large tool results take a path apart from the stream.

An executor uploads a tool result over its threshold in chunks (PutPayloadChunk), then
commits the step with a reference and a truncated view; the model's `read_result` tool
reads slices of it back (GetPayloadSlice). Both are fenced by the lease (the run must be
running under the caller's epoch) and limited to the workspaces the credential serves.
"""

from __future__ import annotations

import re
import uuid

from agentrun.v1 import executor_pb2 as pb
from control_plane.auth import context as auth_context
from control_plane.ground.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from control_plane.store import payloads as payload_store
from control_plane.store.db import Pool
from control_plane.store.errors import Fenced
from control_plane.store.lease import LeaseKey

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# A chunk stays well under the default 4 MiB message limit.
MAX_CHUNK_BYTES = 2 * 1024 * 1024
MAX_SLICE_BYTES = 1024 * 1024
_MAX_MEDIA_TYPE = 200


def _lease(lease: pb.Lease) -> LeaseKey:
    if not lease.workspace_id:
        raise InvalidArgument("lease.workspace_id", "is required")
    try:
        run_id = uuid.UUID(lease.run_id)
    except ValueError:
        raise InvalidArgument("lease.run_id", "is not a UUID") from None
    if lease.epoch <= 0:
        raise InvalidArgument("lease.epoch", "must be positive")
    if not auth_context.current().serves(lease.workspace_id):
        raise PermissionDenied("this executor credential does not serve the lease's workspace")
    return LeaseKey(lease.workspace_id, run_id, lease.epoch)


def _sha256(value: str) -> str:
    if not _SHA256.match(value):
        raise InvalidArgument("sha256", "must be 64 lower-case hex digits")
    return value


def _chunk(req: pb.PutPayloadChunkRequest, max_payload: int) -> payload_store.Chunk:
    sha = _sha256(req.sha256)
    if not 0 <= req.size <= max_payload:
        raise InvalidArgument("size", f"must be between 0 and {max_payload} bytes")
    if not req.media_type or len(req.media_type) > _MAX_MEDIA_TYPE:
        raise InvalidArgument("media_type", f"is required (at most {_MAX_MEDIA_TYPE} characters)")
    if len(req.data) > MAX_CHUNK_BYTES:
        raise InvalidArgument("data", f"a chunk is at most {MAX_CHUNK_BYTES} bytes")
    if req.offset < 0 or req.offset + len(req.data) > req.size:
        raise InvalidArgument("offset", "the chunk must lie within the payload's size")
    return payload_store.Chunk(sha, req.size, req.media_type, req.offset, req.data)


async def put_chunk(
    pool: Pool, req: pb.PutPayloadChunkRequest, max_payload: int
) -> pb.PutPayloadChunkResponse:
    chunk = _chunk(req, max_payload)
    lease = _lease(req.lease)
    try:
        stored = await payload_store.put_chunk(pool, lease, chunk)
    except Fenced as exc:
        raise FailedPrecondition(f"lease: {exc}") from None
    if stored.gap:
        raise InvalidArgument("offset", f"expected {stored.received} (chunks go in order)")
    if stored.mismatch:
        raise InvalidArgument("sha256", "does not match the uploaded bytes (send them again)")
    return pb.PutPayloadChunkResponse(received=stored.received, complete=stored.complete)


async def get_slice(
    pool: Pool, req: pb.GetPayloadSliceRequest, max_payload: int
) -> pb.GetPayloadSliceResponse:
    sha = _sha256(req.sha256)
    if not 0 <= req.offset <= max_payload:
        raise InvalidArgument("offset", f"must be between 0 and {max_payload}")
    if not 0 < req.length <= MAX_SLICE_BYTES:
        raise InvalidArgument("length", f"must be between 1 and {MAX_SLICE_BYTES} bytes")
    lease = _lease(req.lease)
    try:
        found = await payload_store.get_slice(pool, lease, sha, req.offset, req.length)
    except Fenced as exc:
        raise FailedPrecondition(f"lease: {exc}") from None
    except LookupError:
        raise NotFound(f"no payload {sha} in workspace {lease.workspace_id}") from None
    return pb.GetPayloadSliceResponse(data=found.data, size=found.size, media_type=found.media_type)
