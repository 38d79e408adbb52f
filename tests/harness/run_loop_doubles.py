"""Stand-ins for the run loop's stream and lease keeper in unit tests of executor/run_loop.py:
every commit lands, every lease stays held and within its send horizon."""

from __future__ import annotations

from agentrun.v1 import executor_pb2
from executor.stream import CommitReply


class Committer:
    """Records every commit and answers each one OK."""

    def __init__(self) -> None:
        self.commits: list[executor_pb2.Commit] = []

    async def commit(self, commit: executor_pb2.Commit, reply_within: float | None = None):
        self.commits.append(commit)
        result = executor_pb2.CommitResult(outcome=executor_pb2.COMMIT_OUTCOME_OK)
        return CommitReply(result=result, sent_at=0.0)


class Leases:
    """A lease that is always safe, granted on the live stream, and may always send."""

    lease_duration = 30.0

    def is_safe(self, run_id: str) -> bool:
        return True

    def carried_over(self, run_id: str) -> bool:
        return False

    def send_refusal(self, run_id: str) -> str | None:
        return None

    async def wait_to_send(self, run_id: str) -> str | None:
        return None

    def committed(self, run_id: str, epoch: int, result: object, sent_at: float) -> None:
        pass
