"""The store's view of an executor's Commit message: checked, converted and priced."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC

from agentrun.v1 import executor_pb2 as pb
from control_plane.ground import convert, decoding, validate
from control_plane.ground.errors import InvalidArgument
from control_plane.store.steps import CommitRequest, NewStep, Transition, Usage

# What a commit's steps, as (kind, payload JSON), cost: registered where the server is
# assembled (control_plane/credits/pricing.py); raises ValueError on a malformed usage.
Price = Callable[[Iterable[tuple[str, str]]], Usage]
# Step payloads are the executor's (model messages, tool results): deeper than a caller's JSON
# may be, but bounded before Postgres's recursive jsonb parser sees them.
MAX_PAYLOAD_DEPTH = 512
_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


def unpriced(steps: Iterable[tuple[str, str]]) -> Usage:
    """No price table: every commit costs nothing."""
    return Usage()


def check_size(msg: pb.Commit, limit: int) -> None:
    """A commit over the limit is refused for its run alone (large tool results go as
    payloads: PutPayloadChunk); the stream and its other runs carry on."""
    if (size := msg.ByteSize()) > limit:
        raise ValueError(f"commit is {size} bytes, over the {limit}-byte limit")


def commit_request(msg: pb.Commit, price: Price, renew_always: bool = True) -> CommitRequest:
    """The store's view of a Commit message (raises ValueError on bad fields); with
    renew_always False, keeping the lease renews it only when it must (sql/lease.sql)."""
    # The error interceptor leaves a commit's NULs to us: a per-run refusal, not a stream error.
    if path := decoding.nul_path_of_decoded(msg, "commit."):
        raise ValueError(f"{path}: contains a NUL character")
    steps = [
        NewStep(
            seq=s.seq,
            kind=convert.KIND_FROM_PROTO[s.kind],
            ref_seq=s.ref_seq if s.ref_seq else None,
            payload_json=_payload(i, s.payload_json),
        )
        for i, s in enumerate(msg.steps)
    ]
    return CommitRequest(
        workspace_id=msg.lease.workspace_id,
        run_id=uuid.UUID(msg.lease.run_id),
        epoch=msg.lease.epoch,
        steps=steps,
        transition=transition(msg),
        model_calls=msg.model_calls,
        tool_calls=msg.tool_calls,
        tokens=msg.tokens,
        usage=price([(s.kind, s.payload_json) for s in steps]),
        renew_always=renew_always,
        refused_calls=len(refused_rules(steps)),
    )


def refused_rules(steps: Iterable[NewStep]) -> list[str]:
    """The rule of each call an argument constraint refused in `steps` (issue 48): a
    tool_result whose payload names `refused_by`, written by the executor in place of the
    call. Only a payload that has the key at all is parsed (a refusal is rare)."""
    rules = []
    for step in steps:
        if step.kind != "tool_result" or '"refused_by"' not in step.payload_json:
            continue
        rule = json.loads(step.payload_json).get("refused_by")
        if isinstance(rule, str) and rule:
            rules.append(rule)
    return rules


def _payload(i: int, text: str) -> str:
    """A step's payload, checked before Postgres parses it (size and depth bounded, no NUL)."""
    try:
        return validate.json_text(
            f"commit.steps[{i}].payload_json",
            text or "{}",
            max_bytes=_MAX_PAYLOAD_BYTES,
            max_depth=MAX_PAYLOAD_DEPTH,
        )
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


def transition(msg: pb.Commit) -> Transition:
    which = msg.WhichOneof("transition")
    if which == "complete":
        return Transition(status="completed", text=msg.complete.output)
    if which == "fail":
        return Transition(status="failed", text=msg.fail.error)
    if which == "park":
        park = msg.park
        if not park.wait_reason:
            raise ValueError("park.wait_reason is required")
        wake = park.WhichOneof("wake")
        return Transition(
            status="waiting",
            wait_reason=park.wait_reason,
            waiting_connection_id=_connection_id(park.connection_id),
            between_turns=park.between_turns,
            wake_at=park.wake_time.ToDatetime(tzinfo=UTC) if wake == "wake_time" else None,
            wake_after_seconds=park.wake_after.ToTimedelta().total_seconds()
            if wake == "wake_after"
            else None,
        )
    return Transition()


def _connection_id(value: str) -> uuid.UUID | None:
    if not value:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError("park.connection_id: is not a UUID") from None
