"""gRPC errors as one line saying what failed and one saying what to do (no tracebacks)."""

from __future__ import annotations

import argparse

import grpc

_HINTS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.UNAVAILABLE: (
        "is the control plane running? Start the local stack with `agentrun dev`, "
        "or point at yours with --address / AGENTRUN_ADDRESS"
    ),
    grpc.StatusCode.UNAUTHENTICATED: (
        "set AGENTRUN_API_KEY (or a profile's api_key, `agentrun profile set`); "
        "against `agentrun dev` the CLI uses its .data/credentials.json"
    ),
    grpc.StatusCode.PERMISSION_DENIED: (
        "your key's role or workspace does not allow this: use a key that does "
        "(`agentrun apikeys create --role ...`), or check --workspace"
    ),
    grpc.StatusCode.NOT_FOUND: (
        "check the id and the workspace (--workspace); `agentrun agents list` and "
        "`agentrun runs list` show what exists"
    ),
    grpc.StatusCode.INVALID_ARGUMENT: "fix the field it names and run the command again",
    grpc.StatusCode.ALREADY_EXISTS: (
        "pick another id, or use the one that exists (`agentrun agents apply` updates an agent)"
    ),
    grpc.StatusCode.FAILED_PRECONDITION: "the object is not in a state that allows this; look at it first (show)",
    grpc.StatusCode.ABORTED: "someone else changed it first; look at it again, then retry if it still applies",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "a limit was reached: wait a moment, or make the request smaller",
    grpc.StatusCode.DEADLINE_EXCEEDED: (
        "the control plane did not answer in time; retry, and check its log "
        "(`agentrun dev` keeps it in .data/logs/control-plane.log)"
    ),
    grpc.StatusCode.UNIMPLEMENTED: (
        "the control plane does not serve this call: it may be an older version than this CLI"
    ),
    grpc.StatusCode.INTERNAL: "the control plane failed; its log has the details (please report it)",
    grpc.StatusCode.UNKNOWN: "the control plane failed; its log has the details (please report it)",
    grpc.StatusCode.DATA_LOSS: "the control plane failed; its log has the details (please report it)",
    grpc.StatusCode.OUT_OF_RANGE: "a value is outside what the call accepts: check the numbers given",
}


def describe(err: grpc.RpcError, args: argparse.Namespace | None = None) -> tuple[str, str]:
    """(`what failed`, `what to do`) for a failed call."""
    code = err.code()
    details = (err.details() or "").strip().splitlines()
    detail = details[0] if details else code.name.lower().replace("_", " ")
    address = getattr(args, "address", None)
    if code == grpc.StatusCode.UNAVAILABLE and address:
        what = f"cannot reach the control plane at {address} ({detail})"
    else:
        what = f"{code.name}: {detail}"
    hint = _HINTS.get(code, "")
    if address and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED):
        hint = f"{_dialled(address, args)}; {hint}"
    return what, hint


def _dialled(address: str, args: argparse.Namespace | None) -> str:
    """Which control plane was asked, and why that one: a key refused by another checkout's
    stack on 50051 looks like a bad key otherwise."""
    source = getattr(args, "address_from", None)
    return f"dialled {address}" + (f" ({source})" if source else "")


def lines(err: grpc.RpcError, args: argparse.Namespace | None = None) -> list[str]:
    what, hint = describe(err, args)
    return [f"error: {what}"] + ([f"hint: {hint}"] if hint else [])
