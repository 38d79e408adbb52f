"""Large tool results as payloads, with real processes: control plane, executors, sandboxes.

A tool returning 5 MiB is stored as a payload apart from the stream; the model sees the
truncated view the step records; read_result returns a byte-exact slice; the executor's
other runs carry on untouched; a kill -9 between the payload write and the step commit
leaves nothing that breaks replay.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from agentrun.v1 import run_pb2
from sandbox.providers.echo import blob_text
from tests.harness.agentrun_api import Api, sandbox_requests
from tests.harness.invariants import assert_log_well_formed, assert_no_reask
from tests.harness.waiting import eventually

SIZE = 5 * 1024 * 1024
OFFSET, LENGTH = 3_000_000, 5000
# The payload: the blob tool's output as the model would read it (its JSON text).
PAYLOAD = json.dumps({"blob": blob_text(SIZE)}, ensure_ascii=False).encode()


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("big", "big_result", ["blob", "read_result"])
    await api.publish("small", "steps10", ["echo"])
    yield cp, api
    await api.close()


def _result(steps, tool):
    return next(s for s in steps if s.kind == "tool_result" and s.payload["tool"] == tool)


async def _check_big_run(api, db, run_id, sandbox_model):
    steps = await api.steps(run_id)
    assert_log_well_formed(steps)
    model_log = sandbox_requests(sandbox_model.url)
    assert_no_reask(run_id, steps, model_log)
    blob = _result(steps, "blob")
    ref = blob.payload["payload"]
    assert ref == {
        "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
        "size": len(PAYLOAD),
        "media_type": "application/json",
    }
    view = blob.payload["output"]
    assert len(view.encode()) < 16 * 1024 and view.startswith(PAYLOAD[:8192].decode())
    assert f'read_result(ref="{ref["sha256"]}", offset=8192' in view
    # The model was shown exactly the recorded view (its second request: after the blob).
    asked = [r for r in model_log if r["run_id"] == run_id and r["turn"] == 1]
    assert asked and asked[-1]["last_tool_sha256"] == hashlib.sha256(view.encode()).hexdigest()
    sliced = _result(steps, "read_result").payload
    assert sliced["status"] == "ok"
    out = sliced["output"]
    assert out["text"].encode() == PAYLOAD[OFFSET : OFFSET + LENGTH]  # byte-exact
    assert (out["offset"], out["length"], out["size"]) == (OFFSET, LENGTH, len(PAYLOAD))
    # Every referenced payload is stored whole.
    stored = await db.fetch("SELECT sha256, size FROM payloads WHERE workspace_id = 'ws'")
    assert {(r["sha256"], r["size"]) for r in stored} == {(ref["sha256"], ref["size"])}
    chunked = await db.fetchval(
        "SELECT sum(length(data)) FROM payload_chunks WHERE sha256 = $1", ref["sha256"]
    )
    assert chunked == len(PAYLOAD)
    return steps


async def test_a_5_mib_result_is_a_payload_and_other_runs_on_the_executor_are_unaffected(
    stack, db, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    others = [await api.start("small") for _ in range(5)]
    big = await api.start("big")
    executor_factory(cp)
    runs = await api.wait_terminal([big, *others], within=90)
    for run in runs:
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        assert run.attempt == 0 and run.lease_epoch == 1, (run.run_id, run.attempt)
    await _check_big_run(api, db, big, sandbox_model)
    model_log = sandbox_requests(sandbox_model.url)
    for run_id in others:
        steps = await api.steps(run_id)
        assert_log_well_formed(steps)
        assert_no_reask(run_id, steps, model_log)
        assert {s.epoch for s in steps if s.epoch} == {1}  # never re-claimed
    final = next(r for r in runs if r.run_id == big)
    assert json.loads(final.output)["text"] == PAYLOAD[OFFSET : OFFSET + LENGTH].decode()


async def test_kill_between_payload_write_and_commit_resumes_and_reads_again(
    stack, db, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    run_id = await api.start("big")
    (doomed,) = executor_factory(cp, AGENTRUN_FAULTS="executor.payload.after_put=kill")
    await eventually(lambda: not doomed.alive, timeout=60, message="the fault never fired")
    assert doomed.returncode == -9
    # The payload is whole, and no step references it yet.
    assert await db.fetchval("SELECT count(*) FROM payloads") == 1
    steps = await api.steps(run_id)
    assert not [s for s in steps if s.kind == "tool_result"]

    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=90)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.attempt == 1  # taken over once
    await _check_big_run(api, db, run_id, sandbox_model)
    # A read cut off by the crash is simply read again.
    blob_calls = [
        r
        for r in sandbox_requests(sandbox_providers.url)
        if r["path"] == "/echo/blob" and (r["idempotency_key"] or "").startswith(run_id)
    ]
    assert len(blob_calls) == 2
