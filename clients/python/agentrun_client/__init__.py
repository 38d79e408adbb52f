"""agentrun's Python client: start, watch, list, cancel and approve agent runs over gRPC.

    from agentrun_client import Client

    with Client() as client:   # the address and key the `agentrun` CLI would use
        run = client.start_and_wait("triage", "Follow up with ada@example.com")
        print(run.status, run.output)

docs/clients.md describes it; AsyncClient is the asyncio twin of Client.
"""

from agentrun_client.aio import AsyncClient
from agentrun_client.client import Client
from agentrun_client.config import Settings, Tls
from agentrun_client.errors import (
    AgentrunError,
    Cancelled,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServerError,
    Unauthenticated,
    Unavailable,
)
from agentrun_client.profiles import Profile, ProfileError
from agentrun_client.retry import RetryPolicy
from agentrun_client.types import (
    Approval,
    ApprovalState,
    Counters,
    Delta,
    Event,
    OutcomeDecision,
    Page,
    Run,
    RunStatus,
    Session,
    SessionStrategy,
    Signal,
    Step,
    StepKind,
    Turn,
)

__all__ = [
    "AgentrunError",
    "Approval",
    "ApprovalState",
    "AsyncClient",
    "Cancelled",
    "Client",
    "Conflict",
    "Counters",
    "DeadlineExceeded",
    "Delta",
    "Event",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "OutcomeDecision",
    "Page",
    "PermissionDenied",
    "Profile",
    "ProfileError",
    "ResourceExhausted",
    "RetryPolicy",
    "Run",
    "RunStatus",
    "ServerError",
    "Session",
    "SessionStrategy",
    "Settings",
    "Signal",
    "Step",
    "StepKind",
    "Tls",
    "Turn",
    "Unauthenticated",
    "Unavailable",
]
