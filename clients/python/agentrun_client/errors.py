"""One exception hierarchy for failed calls, mapped from gRPC status codes.

try:
    client.approve(approval_id)
except agentrun_client.Conflict as err:    # someone decided first
    print(err.message)
except agentrun_client.InvalidArgument as err:
    print(err.field, err.message)
"""

from __future__ import annotations

import re

import grpc

# The control plane's INVALID_ARGUMENT details start with the field: "priority: must be ...".
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\[\]]*): ")


class AgentrunError(Exception):
    """A call the control plane (or the network) refused: `code` is the gRPC status code,
    `message` its details."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(AgentrunError):
    """A request field is missing, malformed or out of range; `field` names it (or is None)."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message, code)
        found = _FIELD.match(message)
        self.field: str | None = found.group(1) if found else None


class NotFound(AgentrunError):
    code = grpc.StatusCode.NOT_FOUND


class Conflict(AgentrunError):
    """ALREADY_EXISTS (the id is taken, or an event id was used with other content) or
    ABORTED (someone else changed it first: a second decision on an approval)."""

    code = grpc.StatusCode.ABORTED


class FailedPrecondition(AgentrunError):
    """The object is not in a state that allows this (a signal to a run that ended)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(AgentrunError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(AgentrunError):
    """No key, or one the control plane does not accept (AGENTRUN_API_KEY, a profile)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(AgentrunError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(AgentrunError):
    """The control plane could not be reached, after the retries."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(AgentrunError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(AgentrunError):
    code = grpc.StatusCode.CANCELLED


class ServerError(AgentrunError):
    """INTERNAL, UNKNOWN, DATA_LOSS, UNIMPLEMENTED: the control plane's log says why."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[AgentrunError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def from_rpc_error(err: grpc.RpcError) -> AgentrunError:
    """The exception for a failed call (sync or asyncio)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or code.name.lower()
    kind = _BY_CODE.get(code, ServerError)
    return kind(details, code)
