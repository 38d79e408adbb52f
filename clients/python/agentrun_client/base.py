"""What Client and AsyncClient share: the settings, the retry policy and the stubs over one
channel, blocking (grpc.Channel) or asyncio (grpc.aio.Channel) as the subclass opens it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from agentrun.v1 import (
    agent_pb2_grpc,
    approval_pb2_grpc,
    run_pb2_grpc,
    session_pb2_grpc,
)
from agentrun_client._ops import Requests
from agentrun_client.config import Settings
from agentrun_client.profiles import Profile
from agentrun_client.retry import RetryPolicy

TIMEOUT = 30.0
C = TypeVar("C")


class ClientBase(Generic[C]):
    def __init__(
        self,
        address: str | None = None,
        *,
        workspace: str | None = None,
        api_key: str | None = None,
        profile: str | Profile | None = None,
        role: str = "admin",
        data_dir: Path | None = None,
        timeout: float = TIMEOUT,
        retry: RetryPolicy | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.settings = settings or Settings.resolve(
            address, workspace, api_key, profile=profile, role=role, data_dir=data_dir
        )
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._ops = Requests(self.settings.workspace)
        self._channel: C = self._open(self.settings, self.retry.channel_options())
        self.runs = run_pb2_grpc.RunServiceStub(self._channel)
        self.agents = agent_pb2_grpc.AgentServiceStub(self._channel)
        self._stubs: dict[str, Any] = {
            "runs": self.runs,
            "approvals": approval_pb2_grpc.ApprovalServiceStub(self._channel),
            "sessions": session_pb2_grpc.SessionServiceStub(self._channel),
        }

    @staticmethod
    def _open(settings: Settings, options: Sequence[tuple[str, Any]]) -> C:
        raise NotImplementedError

    @property
    def workspace(self) -> str:
        return self.settings.workspace

    @property
    def channel(self) -> C:
        """The channel (its key sent on every call), for stubs of other services."""
        return self._channel
