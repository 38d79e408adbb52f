"""Who may call what: the one table of every RPC's required capability.

Every method of every agentrun service is listed here; the interceptor
refuses a method that is not (tests/integration/test_access_matrix.py walks
the service descriptors so none can be forgotten). Health and reflection
stay open: load balancers and grpcurl need them without a credential.
"""

from __future__ import annotations

from enum import StrEnum

from control_plane.auth.principal import Capability, Kind, Principal


class Need(StrEnum):
    READ = "read"
    OPERATE = "operate"
    ADMIN = "admin"
    DECIDE = "decide"
    EXECUTOR = "executor"  # an executor credential only
    PLATFORM = "platform"  # a platform admin key only
    # A workspace admin acting in its workspace, or a platform admin; the
    # servicer decides what each may do (e.g. who may mint which kind of key).
    ADMIN_OR_PLATFORM = "admin_or_platform"


OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)

_V1 = "/agentrun.v1."

ACCESS: dict[str, Need] = {
    f"{_V1}AgentService/CreateAgent": Need.ADMIN,
    f"{_V1}AgentService/GetAgent": Need.READ,
    f"{_V1}AgentService/PublishAgentVersion": Need.ADMIN,
    f"{_V1}AgentService/GetAgentVersion": Need.READ,
    f"{_V1}AgentService/ListAgents": Need.READ,
    f"{_V1}RunService/StartRun": Need.OPERATE,
    f"{_V1}RunService/GetRun": Need.READ,
    f"{_V1}RunService/ListRuns": Need.READ,
    f"{_V1}RunService/ListRunSteps": Need.READ,
    f"{_V1}RunService/CancelRun": Need.OPERATE,
    f"{_V1}RunService/WatchRun": Need.READ,
    f"{_V1}RunService/ResolveUnknownOutcome": Need.OPERATE,
    f"{_V1}RunService/ForkRun": Need.OPERATE,
    f"{_V1}RunService/SignalRun": Need.OPERATE,
    f"{_V1}RunService/PublishEvent": Need.OPERATE,
    f"{_V1}RunService/BulkCancelRuns": Need.OPERATE,
    f"{_V1}RunService/BulkRerunRuns": Need.OPERATE,
    f"{_V1}RunService/PauseRun": Need.OPERATE,
    f"{_V1}RunService/ResumeRun": Need.OPERATE,
    f"{_V1}RunService/SetQueuePaused": Need.OPERATE,
    f"{_V1}ExecutorService/Connect": Need.EXECUTOR,
    f"{_V1}ExecutorService/PutPayloadChunk": Need.EXECUTOR,
    f"{_V1}ExecutorService/GetPayloadSlice": Need.EXECUTOR,
    f"{_V1}ExecutorService/GetConnectionToken": Need.EXECUTOR,
    f"{_V1}ConnectionService/ListConnections": Need.READ,
    f"{_V1}ChannelService/AddChannel": Need.ADMIN,
    f"{_V1}ChannelService/ListChannels": Need.ADMIN,
    f"{_V1}ChannelService/RemoveChannel": Need.ADMIN,
    f"{_V1}ChannelService/AddAlertRule": Need.ADMIN,
    f"{_V1}ChannelService/ListAlertRules": Need.ADMIN,
    f"{_V1}ChannelService/RemoveAlertRule": Need.ADMIN,
    f"{_V1}ConnectionService/GetConnection": Need.READ,
    f"{_V1}ConnectionService/RevokeConnection": Need.ADMIN,
    f"{_V1}ConnectionService/GetReconnectLink": Need.OPERATE,
    f"{_V1}ApprovalService/ListApprovals": Need.READ,
    f"{_V1}ApprovalService/GetApproval": Need.READ,
    f"{_V1}ApprovalService/DecideApproval": Need.DECIDE,
    f"{_V1}TriggerService/CreateTrigger": Need.ADMIN,
    f"{_V1}TriggerService/GetTrigger": Need.READ,
    f"{_V1}TriggerService/ListTriggers": Need.READ,
    f"{_V1}TriggerService/SetTriggerEnabled": Need.ADMIN,
    f"{_V1}TriggerService/RotateTriggerSecret": Need.ADMIN,
    f"{_V1}TriggerService/ListTriggerEvents": Need.READ,
    f"{_V1}TriggerService/UpdateSchedule": Need.ADMIN,
    f"{_V1}TriggerService/DeleteTrigger": Need.ADMIN,
    f"{_V1}TriggerService/BackfillSchedule": Need.OPERATE,
    f"{_V1}TriggerService/TriggerScheduleNow": Need.OPERATE,
    f"{_V1}SessionService/CreateSession": Need.OPERATE,
    f"{_V1}SessionService/GetSession": Need.READ,
    f"{_V1}SessionService/SendMessage": Need.OPERATE,
    f"{_V1}SessionService/ListTurns": Need.READ,
    f"{_V1}SessionService/ListSessions": Need.READ,
    # Who may see the session is checked by the servicer (control_plane/auth/privacy.py).
    f"{_V1}SessionService/UpdateSessionMembers": Need.OPERATE,
    f"{_V1}StreamService/ReadStream": Need.READ,
    f"{_V1}WorkspaceAdminService/CreateWorkspace": Need.PLATFORM,
    f"{_V1}WorkspaceAdminService/GetWorkspace": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/SetWorkspacePlan": Need.PLATFORM,
    f"{_V1}WorkspaceAdminService/SetWorkspaceRetention": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/SetApprovalWatch": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/SetAllowlist": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/SetWaitLimit": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/CreateApiKey": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/ListApiKeys": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/RevokeApiKey": Need.ADMIN_OR_PLATFORM,
    f"{_V1}WorkspaceAdminService/AddMember": Need.ADMIN,
    f"{_V1}WorkspaceAdminService/RemoveMember": Need.ADMIN,
    f"{_V1}WorkspaceAdminService/ListMembers": Need.ADMIN,
    f"{_V1}WorkspaceAdminService/ListAuditLog": Need.ADMIN_OR_PLATFORM,
    f"{_V1}CreditService/GrantCredits": Need.PLATFORM,
    f"{_V1}CreditService/GetCreditBalance": Need.READ,
    f"{_V1}CreditService/ListCreditLedger": Need.READ,
    # The tool registry (issue 18): what an agent can reach is set by the workspace's admins.
    f"{_V1}ToolService/CreateTool": Need.ADMIN,
    f"{_V1}ToolService/GetTool": Need.READ,
    f"{_V1}ToolService/ListTools": Need.READ,
    f"{_V1}ToolService/ImportOpenApi": Need.ADMIN,
    f"{_V1}McpServerService/AddMcpServer": Need.ADMIN,
    f"{_V1}McpServerService/GetMcpServer": Need.READ,
    f"{_V1}McpServerService/ListMcpServers": Need.READ,
    f"{_V1}McpServerService/SyncMcpServer": Need.ADMIN,
    # Deploys (control_plane/deploys/releases.py, canary.py): the platform's operators.
    f"{_V1}ReleaseService/ListReleases": Need.PLATFORM,
    f"{_V1}ReleaseService/GetRelease": Need.PLATFORM,
    f"{_V1}ReleaseService/DrainRelease": Need.PLATFORM,
    f"{_V1}ReleaseService/PromoteRelease": Need.PLATFORM,
    f"{_V1}ReleaseService/RampRelease": Need.PLATFORM,
    f"{_V1}ReleaseService/RollbackRelease": Need.PLATFORM,
    f"{_V1}ReleaseService/MoveRunRelease": Need.PLATFORM,
    f"{_V1}ReleaseService/BulkMoveRunsRelease": Need.PLATFORM,
    f"{_V1}CanaryService/RunCanary": Need.PLATFORM,
}


def is_open(method: str) -> bool:
    """Health and reflection: served to anyone."""
    return method.lstrip("/").split("/", 1)[0] in OPEN_SERVICES


def allows(need: Need, who: Principal) -> bool:
    """Whether `who` holds what `need` asks for (workspace checks come later, per request)."""
    if need is Need.EXECUTOR:
        return who.kind is Kind.EXECUTOR
    if need is Need.PLATFORM:
        return who.kind is Kind.PLATFORM
    if need is Need.ADMIN_OR_PLATFORM:
        return who.kind is Kind.PLATFORM or who.may(Capability.ADMIN)
    return who.may(Capability(need.value))
