"""The run loop on rate limits and model outages: it parks instead of waiting, and resumes right.

Fakes only: a committer that acknowledges every commit, always-safe leases, a
delivery that raises or answers as scripted, a model that is down or answers.
"""

from __future__ import annotations

import json
import random
from typing import Any

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import replay
from executor.models.base import ModelReply, ModelUnavailable
from executor.models.retry import ModelRetry
from executor.ratelimit.limiter import RateLimited
from executor.run_loop import RunDeps, RunLoop
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import Outcome
from tests.harness.run_loop_doubles import Committer, Leases

RUN = "00000000-0000-4000-8000-000000000006"
EPOCH = 5
MAIL = {
    "id": "c1",
    "name": "send_email",
    "arguments": {"to": "ada@example.com", "subject": "hi", "body": "hello"},
}


class Model:
    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.calls = 0

    async def complete(self, model, messages, tools, run_id, seq) -> ModelReply:
        self.calls += 1
        if self.down:
            raise ModelUnavailable("model provider returned 503")
        return ModelReply(content="done")


class Delivery:
    """Raises or answers, in order, for `send` and `resolve_unknown` alike."""

    def __init__(self, *answers: Outcome | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str]] = []

    async def send(self, tool, arguments, key, guard) -> Outcome:
        self.calls.append(("send", key))
        return self._next()

    async def resolve_unknown(self, tool, recorded_class, arguments, key, guard, key_age=0.0):
        self.calls.append(("resolve", key))
        return self._next()

    def _next(self) -> Outcome:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def step(seq: int, kind: int, payload: dict, ref_seq: int = 0) -> run_pb2.Step:
    return run_pb2.Step(
        run_id=RUN, seq=seq, kind=kind, ref_seq=ref_seq, payload_json=json.dumps(payload)
    )


def decided_to_mail() -> list[run_pb2.Step]:
    decision = {"content": None, "tool_calls": [MAIL], "usage": {}, "response_id": "r1"}
    return [step(0, replay.INPUT, {"text": "go"}), step(1, replay.DECISION, decision)]


def started_and_parked(park_epoch: int) -> list[run_pb2.Step]:
    started = {
        "call_id": "c1",
        "tool": "send_email",
        "arguments": MAIL["arguments"],
        "idempotency_key": f"{RUN}:2",
        "class": "none",
    }
    park = {
        "wait_reason": "rate",
        "wake_after_seconds": 0.4,
        "note": "no token",
        "cause": "empty",
        "unsent_call_seq": 2,
        "epoch": park_epoch,
    }
    return [*decided_to_mail(), step(2, replay.STARTED, started, 1), step(3, replay.PARK, park)]


async def run_once(
    log: list[run_pb2.Step], delivery: Delivery, model: Model | None = None, budget: int = 0
) -> tuple[str, Committer]:
    committer = Committer()
    run = run_pb2.Run(
        workspace_id="ws",
        run_id=RUN,
        lease_epoch=EPOCH,
        limits=agent_pb2.RunLimits(model_retry_budget=budget),
    )
    spec = agent_pb2.AgentSpec(tools=["send_email"])
    assignment = executor_pb2.Assignment(
        run=run, agent_version=agent_pb2.AgentVersion(spec=spec), steps=log
    )
    deps = RunDeps(
        committer=committer,
        leases=Leases(),
        model=model or Model(),
        delivery=delivery,  # type: ignore[arg-type]
        catalogue=Catalogue.load(),
        rng=random.Random(0),
        model_retry=ModelRetry(cap=4.0),
    )
    return await RunLoop(assignment, deps).run(), committer


def payloads(commit: executor_pb2.Commit) -> list[tuple[str, dict[str, Any]]]:
    return [(replay.kind_name(s.kind), json.loads(s.payload_json)) for s in commit.steps]


async def test_no_token_parks_the_run_saying_the_call_never_went_out():
    limited = RateLimited("empty", 0.4, "mail rate limit: next token in 0.4s")
    ended, committer = await run_once(decided_to_mail(), Delivery(limited))
    assert ended == "parked"
    started, parked = committer.commits
    assert [k for k, _ in payloads(started)] == ["tool_started"]
    ((kind, park),) = payloads(parked)
    assert (kind, park["wait_reason"], park["unsent_call_seq"], park["epoch"]) == (
        "park",
        "rate",
        2,
        EPOCH,
    )
    assert parked.park.wait_reason == "rate"
    assert parked.park.wake_after.ToTimedelta().total_seconds() == 0.4


async def test_on_the_next_lease_the_held_back_call_goes_out_under_its_key():
    delivery = Delivery(Outcome("ok", output={"sent": True}))
    ended, committer = await run_once(started_and_parked(EPOCH - 1), delivery)
    assert delivery.calls == [("send", f"{RUN}:2")]  # sent, although its class is `none`
    (result,) = [p for c in committer.commits for k, p in payloads(c) if k == "tool_result"]
    assert result["status"] == "ok" and ended == "completed"


async def test_a_later_lease_resolves_it_by_class_as_it_may_have_gone_out():
    delivery = Delivery(Outcome.unknown("lost"))
    await run_once(started_and_parked(EPOCH - 2), delivery)
    assert delivery.calls == [("resolve", f"{RUN}:2")]


async def test_limited_again_on_resume_parks_again_for_the_same_call():
    delivery = Delivery(RateLimited("429", 3.0, "mail answered 429"))
    ended, committer = await run_once(started_and_parked(EPOCH - 1), delivery)
    ((kind, park),) = payloads(committer.commits[0])
    assert ended == "parked" and (park["unsent_call_seq"], park["epoch"]) == (2, EPOCH)


def model_parks(n: int) -> list[run_pb2.Step]:
    log = [step(0, replay.INPUT, {"text": "go"})]
    for i in range(n):
        log.append(step(1 + i, replay.PARK, {"wait_reason": "model", "wake_after_seconds": 1}))
    return log


async def test_a_model_outage_parks_with_backoff_within_the_budget():
    ended, committer = await run_once(model_parks(3), Delivery(), Model(down=True), budget=5)
    assert ended == "parked"
    park = committer.commits[0].park
    assert park.wait_reason == "model"
    assert 2.0 <= park.wake_after.ToTimedelta().total_seconds() <= 4.0  # 8 s capped at 4


async def test_past_the_budget_the_run_fails_with_a_clear_reason():
    ended, committer = await run_once(model_parks(5), Delivery(), Model(down=True), budget=5)
    assert ended == "failed"
    error = committer.commits[0].fail.error
    assert error == (
        "model unavailable after 6 attempts (model_retry_budget 5): model provider returned 503"
    )


async def test_limited_while_resolving_by_class_leaves_no_unsent_mark():
    delivery = Delivery(RateLimited("empty", 0.5, "no token"))
    ended, committer = await run_once(started_and_parked(EPOCH - 2), delivery)
    ((_, park),) = payloads(committer.commits[0])
    assert ended == "parked" and park["wait_reason"] == "rate"
    assert "unsent_call_seq" not in park  # it may have gone out under an earlier lease
