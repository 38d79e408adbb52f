"""A model call's text goes out in small chunks (executor/deltas.py): the first piece at
once, the next ones gathered for at most CHUNK_SECONDS (or CHUNK_CHARS), the rest when the
call ends; each chunk under the hold's lease, the call's seq and the next index."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.v1 import executor_pb2
from executor import deltas
from executor.config import ExecutorConfig


async def test_pieces_are_gathered_into_chunks_sent_in_order_under_the_lease() -> None:
    sent: list[executor_pb2.ModelDelta] = []
    lease = executor_pb2.Lease(run_id="r", epoch=3, workspace_id="ws")
    chunks = deltas.Chunks(sent.append, lease, seq=5)
    chunks.piece("Hello")  # the first goes at once
    chunks.piece(",")
    chunks.piece(" world")
    assert [d.text for d in sent] == ["Hello"]
    await asyncio.sleep(deltas.CHUNK_SECONDS * 3)  # gathered, then sent
    assert [d.text for d in sent] == ["Hello", ", world"]
    chunks.piece("x" * deltas.CHUNK_CHARS)  # enough waiting: sent without waiting
    chunks.piece("!")
    chunks.piece("")  # nothing
    chunks.flush()  # the call ended: the rest, and nothing after
    await asyncio.sleep(deltas.CHUNK_SECONDS * 3)
    assert [d.text for d in sent] == ["Hello", ", world", "x" * deltas.CHUNK_CHARS, "!"]
    assert [d.index for d in sent] == [0, 1, 2, 3]
    assert {(d.seq, d.lease.epoch, d.lease.run_id) for d in sent} == {(5, 3, "r")}


def test_streaming_every_call_is_on_unless_switched_off() -> None:
    assert ExecutorConfig.from_env({}).model_stream
    assert not ExecutorConfig.from_env({"AGENTRUN_MODEL_STREAM": "off"}).model_stream
    assert ExecutorConfig.from_env({"AGENTRUN_MODEL_STREAM": "On"}).model_stream
    with pytest.raises(ValueError, match="AGENTRUN_MODEL_STREAM must be on or off"):
        ExecutorConfig.from_env({"AGENTRUN_MODEL_STREAM": "sometimes"})
