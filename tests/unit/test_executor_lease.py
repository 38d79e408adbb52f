"""The executor's lease arithmetic, heartbeat results and self-fencing, on an injected clock."""

from __future__ import annotations

import pytest

from agentrun.v1 import executor_pb2
from executor.lease import HeldLease, LeaseKeeper, safety_margin


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lease(run_id: str = "r1", epoch: int = 3) -> executor_pb2.Lease:
    return executor_pb2.Lease(workspace_id="w", run_id=run_id, epoch=epoch)


class Recorder:
    """Collects fenced runs and answers heartbeats with a prepared result."""

    def __init__(self, answer: executor_pb2.HeartbeatResult | None = None) -> None:
        self.fenced: list[tuple[str, str]] = []
        self.sent: list[list[str]] = []
        self.answer = answer

    def fence(self, run_id: str, reason: str) -> None:
        self.fenced.append((run_id, reason))

    async def heartbeat(self, leases, reply_within):
        self.sent.append([item.run_id for item in leases])
        return self.answer


def keeper(clock: Clock, rec: Recorder) -> LeaseKeeper:
    return LeaseKeeper(
        rec.heartbeat, rec.fence, clock=clock, lease_duration=30, heartbeat_interval=10
    )


def test_safety_margin_is_a_fifth_of_the_lease_but_at_least_half_a_second():
    assert safety_margin(30) == 6
    assert safety_margin(1) == 0.5


def test_held_lease_is_safe_until_the_margin_before_expiry():
    held = HeldLease(lease(), valid_until=130.0)
    assert held.is_safe(123.9, 6)
    assert not held.is_safe(124.0, 6)


def test_renewal_counts_from_the_send_time_and_never_shortens():
    held = HeldLease(lease(), valid_until=130.0)
    held.renew(sent_at=105.0, lease_duration=30)
    assert held.valid_until == 135.0
    held.renew(sent_at=101.0, lease_duration=30)  # a late reply to an older heartbeat
    assert held.valid_until == 135.0


def test_a_new_lease_is_valid_for_one_lease_duration():
    clock, rec = Clock(), Recorder()
    leases = keeper(clock, rec)
    leases.hold(lease())
    assert leases.get("r1").valid_until == 130.0
    clock.now = 123.9
    assert leases.is_safe("r1")
    clock.now = 124.0
    assert not leases.is_safe("r1")
    assert not leases.is_safe("unknown-run")


def renewed_to(seconds: int) -> executor_pb2.CommitResult:
    result = executor_pb2.CommitResult(outcome=executor_pb2.COMMIT_OUTCOME_OK)
    result.lease_expire_time.FromSeconds(seconds)
    return result


def test_acknowledged_commit_renews_only_the_same_epoch():
    clock, rec = Clock(), Recorder()
    leases = keeper(clock, rec)
    leases.hold(lease(epoch=3))
    leases.committed("r1", epoch=2, result=renewed_to(1_900_000_000), sent_at=120.0)
    assert leases.get("r1").valid_until == 130.0
    leases.committed("r1", epoch=3, result=renewed_to(1_900_000_000), sent_at=120.0)
    assert leases.get("r1").valid_until == 150.0


def test_a_commit_that_did_not_renew_leaves_the_lease_as_it_was():
    """The control plane keeps a lease with more than half left as it is and says so by
    leaving lease_expire_time unset: the executor must not count the commit."""
    clock, rec = Clock(), Recorder()
    leases = keeper(clock, rec)
    leases.hold(lease(epoch=3))
    kept = executor_pb2.CommitResult(outcome=executor_pb2.COMMIT_OUTCOME_OK)
    leases.committed("r1", epoch=3, result=kept, sent_at=120.0)
    assert leases.get("r1").valid_until == 130.0
    clock.now = 124.0  # the margin before the lease the database still has
    assert not leases.is_safe("r1")


def test_heartbeat_renews_from_its_send_time_and_fences_refused_leases():
    clock, rec = Clock(), Recorder()
    leases = keeper(clock, rec)
    leases.hold(lease("r1"))
    leases.hold(lease("r2"))
    result = executor_pb2.HeartbeatResult(
        checked=True,
        leases=[
            executor_pb2.LeaseStatus(lease=lease("r1"), renewed=True),
            executor_pb2.LeaseStatus(lease=lease("r2"), renewed=False, reason="cancelled"),
        ],
    )
    leases.apply(result, sent_at=110.0)
    assert leases.get("r1").valid_until == 140.0
    assert leases.get("r2") is None
    assert rec.fenced == [("r2", "cancelled")]
    assert [item.run_id for item in leases.held()] == ["r1"]


def test_unchecked_heartbeat_renews_nothing_and_refuses_nothing():
    clock, rec = Clock(), Recorder()
    leases = keeper(clock, rec)
    leases.hold(lease())
    unchecked = executor_pb2.HeartbeatResult(
        checked=False, leases=[executor_pb2.LeaseStatus(lease=lease(), renewed=False)]
    )
    leases.apply(unchecked, sent_at=120.0)
    assert leases.get("r1").valid_until == 130.0
    assert rec.fenced == []


def test_status_for_another_epoch_is_ignored():
    clock, rec = Clock(), Recorder()
    leases = keeper(clock, rec)
    leases.hold(lease(epoch=4))
    stale = executor_pb2.HeartbeatResult(
        checked=True, leases=[executor_pb2.LeaseStatus(lease=lease(epoch=3), renewed=False)]
    )
    leases.apply(stale, sent_at=120.0)
    assert rec.fenced == []


async def test_tick_fences_leases_it_could_not_renew_in_time():
    clock, rec = Clock(), Recorder(answer=None)  # stream down: no heartbeat reply
    leases = keeper(clock, rec)
    leases.hold(lease("r1"))
    clock.now = 120.0
    await leases.tick()
    assert rec.fenced == [] and rec.sent == [["r1"]]
    clock.now = 124.5  # within the 6 s margin of 130
    await leases.tick()
    assert rec.fenced == [("r1", "lease would lapse before it could be renewed")]
    assert leases.held() == []


async def test_tick_renews_with_the_control_planes_answer():
    clock = Clock()
    answer = executor_pb2.HeartbeatResult(
        checked=True, leases=[executor_pb2.LeaseStatus(lease=lease(), renewed=True)]
    )
    rec = Recorder(answer)
    leases = keeper(clock, rec)
    leases.hold(lease())
    clock.now = 110.0
    await leases.tick()
    assert leases.get("r1").valid_until == 140.0


def test_welcome_durations_replace_the_defaults():
    leases = keeper(Clock(), Recorder())
    leases.configure(lease_duration=3.0, heartbeat_interval=1.0)
    assert (leases.lease_duration, leases.heartbeat_interval) == (3.0, 1.0)
    assert leases.margin == pytest.approx(0.6)
    leases.configure(lease_duration=0, heartbeat_interval=0)
    assert leases.lease_duration == 3.0
