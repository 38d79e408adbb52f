"""The run loop's side of summaries: what it asks the model and commits, past the threshold.

The loop runs against the fakes of test_tool_run_loop (a committer that records
every commit, always-safe leases) and a scripted model, the provider's stand-in.
"""

from __future__ import annotations

import json
from typing import Any

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import context, replay, steps, transcript
from executor.models.base import ModelReply, ModelUnavailable, ToolCall, Usage
from executor.run_loop import RunDeps, RunLoop
from executor.tools.catalogue import Catalogue
from tests.unit.test_tool_run_loop import RUN, Committer, Delivery, Leases, payloads

INSTRUCTIONS = "You reconcile ledgers."
CATALOGUE = Catalogue.load()  # once: loading it checks every schema


class Model:
    """Answers a summarisation request with `recap` (or raises it), anything else with a
    final text; remembers every request."""

    def __init__(self, recap: str | Exception = "RECAP") -> None:
        self.recap = recap
        self.asked: list[tuple[int, list[dict[str, Any]]]] = []

    async def complete(self, model, messages, tools, run_id, seq) -> ModelReply:
        self.asked.append((seq, list(messages)))
        if not messages[-1]["content"].startswith(context.REQUEST_MARKER):
            return ModelReply("done", (), Usage(50, 5), f"d{seq}")
        if isinstance(self.recap, Exception):
            raise self.recap
        return ModelReply(self.recap, (), Usage(300, 20), f"s{seq}")


def log_of(turns: int) -> list[run_pb2.Step]:
    """An input, then `turns` echo calls, each answered."""
    new = [steps.new_step(0, replay.INPUT, {"text": "check the ledger"})]
    for _ in range(turns):
        seq = len(new)
        call = ToolCall(f"call_{seq}", "echo", {"text": f"{seq} " + "x" * 300})
        reply = ModelReply(None, (call,), Usage(10, 10), f"r{seq}")
        new += [
            steps.decision(seq, reply, "m"),
            steps.tool_started(seq + 1, seq, call.id, "echo", call.arguments or {}, RUN, "read"),
            steps.tool_result(seq + 2, seq + 1, call.id, "echo", "ok", output={"echo": "ok"}),
        ]
    return [
        run_pb2.Step(
            run_id=RUN, seq=s.seq, kind=s.kind, ref_seq=s.ref_seq, payload_json=s.payload_json
        )
        for s in new
    ]


async def run_once(log: list[run_pb2.Step], model: Model, threshold: int) -> tuple[str, Committer]:
    committer = Committer()
    run = run_pb2.Run(
        workspace_id="ws",
        run_id=RUN,
        lease_epoch=2,
        limits=agent_pb2.RunLimits(context_tokens=threshold),
    )
    spec = agent_pb2.AgentSpec(model="m", instructions=INSTRUCTIONS, tools=["echo"])
    assignment = executor_pb2.Assignment(
        run=run, agent_version=agent_pb2.AgentVersion(spec=spec), steps=log
    )
    deps = RunDeps(committer, Leases(), model, Delivery(), CATALOGUE)  # type: ignore[arg-type]
    return await RunLoop(assignment, deps).run(), committer


THRESHOLD = 600  # log_of(10) is ~1,200 estimated tokens


async def test_past_the_threshold_the_recap_is_committed_then_the_model_reads_it():
    model = Model()
    ended, committer = await run_once(log_of(10), model, THRESHOLD)
    assert ended == "completed"
    summary, decision = committer.commits
    [(kind, recorded)] = payloads(summary)
    assert kind == "summary" and recorded["text"] == "RECAP" and recorded["from_seq"] == 1
    assert summary.steps[0].seq == 31 and summary.tokens == 320 and summary.model_calls == 0
    assert recorded["response_id"] == "s31"
    (asked_seq, request), (decided_seq, prompt) = model.asked
    assert (asked_seq, decided_seq) == (31, 32)
    assert request[-1]["content"] == context.REQUEST_TEXT
    assert any(m["content"].endswith("\nRECAP") for m in prompt if m["role"] == "user")
    assert context.estimate_tokens(prompt) <= THRESHOLD
    assert [kind for kind, _ in payloads(decision)] == ["model_decision", "finish"]


async def test_a_run_whose_recap_is_recorded_never_asks_for_it_again():
    first = Model()
    _, committer = await run_once(log_of(10), first, THRESHOLD)
    recorded = committer.commits[0].steps[0]
    log = [
        *log_of(10),
        run_pb2.Step(
            run_id=RUN, seq=recorded.seq, kind=recorded.kind, payload_json=recorded.payload_json
        ),
    ]
    again = Model(recap=AssertionError("asked for a recap again"))
    ended, committer = await run_once(log, again, THRESHOLD)
    assert ended == "completed"
    [(seq, prompt)] = again.asked
    assert seq == 32 and prompt == first.asked[1][1]  # the same prompt, from the record


async def test_under_the_threshold_or_without_one_no_recap_is_asked():
    for threshold in (0, 100_000):
        model = Model(recap=AssertionError("no recap wanted"))
        ended, committer = await run_once(log_of(10), model, threshold)
        assert ended == "completed" and len(model.asked) == 1


async def test_a_reply_without_text_records_nothing_and_the_prompt_goes_whole():
    model = Model(recap="   ")
    ended, committer = await run_once(log_of(10), model, THRESHOLD)
    assert ended == "completed"
    [decision] = committer.commits
    assert "summary" not in [kind for kind, _ in payloads(decision)]
    assert len(model.asked[1][1]) == len(
        transcript.build_messages(replay.decode(log_of(10)), INSTRUCTIONS)
    )


async def test_a_provider_down_while_summarising_parks_the_run_as_for_a_decision():
    model = Model(recap=ModelUnavailable("model provider returned 503", retry_after=7.0))
    ended, committer = await run_once(log_of(10), model, THRESHOLD)
    assert ended == "parked"
    [park] = committer.commits
    assert park.park.wait_reason == "model" and park.park.wake_after.seconds >= 7
    assert json.loads(park.steps[0].payload_json)["note"] == "model provider returned 503"
