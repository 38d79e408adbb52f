"""Summaries as steps and a stable prefix, with real processes: control plane, executors,
the sandbox model (which records every prompt of the `long_run` scenario) and providers.

A 60-step run whose agent has a context threshold: past it the executor asks the model
for a recap, commits it as a `summary` step and sends the recap in place of the older
steps, so every prompt after the first summary is under the threshold; between summaries
each prompt extends the previous one byte for byte (instructions, tools, then steps);
a kill -9 right after a summary is committed resumes with that very recap, never asked
for again.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from agentrun.v1 import run_pb2
from executor import context
from tests.harness.agentrun_api import Api, LoggedStep, sandbox_requests
from tests.harness.invariants import assert_log_well_formed, assert_no_reask
from tests.harness.waiting import eventually

# Each of long_run's 20 turns adds ~195 estimated tokens to the prompt: the first summary
# comes at the eighth model call, then about every fourth.
THRESHOLD = 1500


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("ledger", "long_run", ["echo"], context_tokens=THRESHOLD)
    yield cp, api
    await api.close()


def _requests(sandbox_url: str, run_id: str) -> list[dict[str, Any]]:
    mine = [r for r in sandbox_requests(sandbox_url) if r["run_id"] == run_id]
    assert all(r["status"] == 200 for r in mine)
    return sorted(mine, key=lambda r: r["n"])


def _estimate(prompt: str) -> int:
    """The executor's estimate of a recorded prompt (system, tools, then messages)."""
    lines = [json.loads(line) for line in prompt.splitlines()]
    tools = lines.pop(1)["tools"]
    return context.estimate_tokens(lines, tools)


def _head(prompt: str) -> str:
    """Instructions, tools and the run's input: the part no summary replaces."""
    return "".join(line + "\n" for line in prompt.splitlines()[:3])


def _summaries(steps: list[LoggedStep]) -> list[LoggedStep]:
    return [s for s in steps if s.kind == "summary"]


def assert_summaries_asked_once(steps: list[LoggedStep], requests: list[dict[str, Any]]) -> None:
    """Each summary step is the answer of one summarisation request, never asked again."""
    asked = [r for r in requests if r.get("summary")]
    assert len(asked) == len(_summaries(steps))
    for step in _summaries(steps):
        (answer,) = [r for r in asked if r["response_id"] == step.payload["response_id"]]
        assert [r["seq"] for r in asked].count(step.seq) == 1, f"recap {step.seq} asked again"
        assert answer["seq"] == step.seq


def assert_prompts_extend(steps: list[LoggedStep], requests: list[dict[str, Any]]) -> None:
    """Between summaries each prompt is the previous one extended, byte for byte; after a
    summary the prompt keeps the head and carries the new recap in place of its span."""
    recaps = {s.seq: s.payload["text"] for s in _summaries(steps)}
    previous: str | None = None
    recap: str | None = None
    for request in requests:
        prompt = request["prompt"]
        if request.get("summary"):
            # The ask reads the prompt so far (a prefix of the last one: the cache hits).
            assert previous is not None and previous.startswith(_drop_last_line(prompt))
            recap = recaps[request["seq"]]
            continue
        if previous is not None and recap is None:
            assert prompt.startswith(previous) and len(prompt) > len(previous), request["seq"]
        elif previous is not None:
            assert prompt.startswith(_head(previous)) and not prompt.startswith(previous)
            assert json.dumps(recap, ensure_ascii=False)[1:-1] in prompt
        previous, recap = prompt, None


def _drop_last_line(prompt: str) -> str:
    return "".join(line + "\n" for line in prompt.splitlines()[:-1])


async def test_a_60_step_run_with_summaries_stays_under_the_threshold_and_its_prefix_stable(
    stack, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    run_id = await api.start("ledger")
    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=120)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.output == "All twenty batches are checked."
    steps = await api.steps(run_id)
    assert_log_well_formed(steps)
    assert len(steps) >= 60
    assert len([s for s in steps if s.kind == "tool_result"]) == 20  # every turn played once
    summaries = _summaries(steps)
    assert len(summaries) >= 3, [s.seq for s in summaries]
    requests = _requests(sandbox_model.url, run_id)
    assert_no_reask(run_id, steps, requests)
    assert_summaries_asked_once(steps, requests)
    assert_prompts_extend(steps, requests)
    first = next(r["n"] for r in requests if r.get("summary"))
    calls = [r for r in requests if not r.get("summary")]
    sizes = [_estimate(r["prompt"]) for r in calls if r["n"] > first]
    assert sizes and max(sizes) <= THRESHOLD, sizes
    # Without summaries the last prompt would have been far over it.
    assert _estimate(calls[0]["prompt"]) + 20 * 150 > THRESHOLD
    # Each later summary recaps the earlier recap and the turns after it.
    spans = [(s.payload["from_seq"], s.payload["through_seq"]) for s in summaries]
    assert {start for start, _ in spans} == {1}
    assert [end for _, end in spans] == sorted({end for _, end in spans})
    # A summary's tokens count on the run, though it is not a model call.
    used = sum(
        s.payload["usage"]["prompt_tokens"] + s.payload["usage"]["completion_tokens"]
        for s in steps
        if s.kind in ("summary", "model_decision")
    )
    assert run.counters.tokens == used and run.counters.model_calls == 21


async def test_kill_after_a_summary_committed_resumes_with_the_same_recap(
    stack, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    run_id = await api.start("ledger")
    (doomed,) = executor_factory(cp, AGENTRUN_FAULTS="executor.summary.after_commit=kill")
    await eventually(lambda: not doomed.alive, timeout=60, message="no summary was committed")
    assert doomed.returncode == -9
    (recorded,) = _summaries(await api.steps(run_id))

    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=120)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.attempt == 1  # taken over once
    steps = await api.steps(run_id)
    assert_log_well_formed(steps)
    assert _summaries(steps)[0] == recorded  # the recap on record is the one committed
    requests = _requests(sandbox_model.url, run_id)
    assert_no_reask(run_id, steps, requests)
    assert_summaries_asked_once(steps, requests)  # the sandbox was never asked for it again
    # The survivor's first call read the recorded recap (its nonce makes a new one differ).
    resumed = next(r for r in requests if r["seq"] == recorded.seq + 1)
    assert json.dumps(recorded.payload["text"], ensure_ascii=False)[1:-1] in resumed["prompt"]
    assert _estimate(resumed["prompt"]) <= THRESHOLD
    assert_prompts_extend(steps, requests)


async def test_the_threshold_is_checked_at_publish_and_copied_at_admission(stack):
    cp, api = stack
    run_id = await api.start("ledger")
    # A new version does not change the run under way.
    await api.publish("ledger", "long_run", ["echo"], context_tokens=0)
    assert (await api.get(run_id)).limits.context_tokens == THRESHOLD
    assert (await api.get(await api.start("ledger"))).limits.context_tokens == 0
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await api.publish("ledger", "long_run", ["echo"], context_tokens=-1)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.limits.context_tokens" in (refused.value.details() or "")
