"""Tags and metadata on runs (issue 45): set at StartRun, set by the run's own recorded
set_metadata calls, and filtered by ListRuns, against a real control plane, executor, sandbox
model and Postgres."""

from __future__ import annotations

import json

import grpc
import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api


@pytest.fixture
async def api(db_url, control_plane, sandbox_model, sandbox_providers, executor_factory):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("tagger", "tagger", ["set_metadata", "sleep"])
    await api.publish("quiet", "writer", [])
    executor_factory(cp)
    yield api
    await api.close()


async def start(api: Api, agent: str, tags=(), metadata=None) -> run_pb2.Run:
    req = run_pb2.StartRunRequest(
        workspace_id=api.ws,
        agent_id=agent,
        input="go",
        tags=list(tags),
        metadata_json=json.dumps(metadata) if metadata is not None else "",
    )
    return (await api.runs.StartRun(req)).run


async def listed(api: Api, **filters) -> set[str]:
    req = run_pb2.ListRunsRequest(workspace_id=api.ws, page_size=500, **filters)
    return {r.run_id for r in (await api.runs.ListRuns(req)).runs}


async def refused(call, *words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    for word in words:
        assert word in info.value.details()


async def test_tags_and_metadata_set_at_start_and_by_the_run_filter_list_runs(api):
    tagged = await start(api, "tagger", ["batch-7", "eu"], {"customer": "c-1", "tier": "gold"})
    assert list(tagged.tags) == ["batch-7", "eu"]
    assert json.loads(tagged.metadata_json) == {"customer": "c-1", "tier": "gold"}
    other = await start(api, "quiet", ["batch-8"], {"customer": "c-2"})
    plain = await start(api, "quiet")
    assert list(plain.tags) == [] and json.loads(plain.metadata_json) == {}

    assert await listed(api, tag="batch-7") == {tagged.run_id}
    assert await listed(api, tag="eu", agent_id="quiet") == set()
    assert await listed(api, metadata="customer=c-2") == {other.run_id}
    assert await listed(api, tag="batch-7", metadata="customer=c-2") == set()
    assert await listed(api) >= {tagged.run_id, other.run_id, plain.run_id}

    # The run's own set_metadata calls: recorded steps, whose result the run row follows.
    (done,) = await api.wait_terminal([tagged.run_id])
    assert done.status == run_pb2.RUN_STATUS_COMPLETED, done.error
    # "customer": null removed its key; the tag was added; the bad tag changed nothing.
    assert json.loads(done.metadata_json) == {"tier": "gold", "stage": "drafted"}
    assert list(done.tags) == ["batch-7", "eu", "drafted"]
    results = [
        s
        for s in await api.steps(tagged.run_id)
        if s.kind == "tool_result" and s.payload["tool"] == "set_metadata"
    ]
    assert [r.payload["status"] for r in results] == ["ok", "error"]
    assert results[0].payload["output"]["tags"] == ["batch-7", "eu", "drafted"]
    assert "Not A Slug" in results[1].payload["error"]
    assert await listed(api, tag="drafted") == {tagged.run_id}
    assert await listed(api, metadata="stage=drafted") == {tagged.run_id}
    assert await listed(api, metadata="customer=c-1") == set()


async def test_bad_tags_metadata_and_filters_are_refused_by_name(api):
    await refused(start(api, "quiet", ["Bad Tag"]), "tags", "Bad Tag")
    await refused(start(api, "quiet", ["x" * 65]), "tags")
    await refused(start(api, "quiet", [f"t{i}" for i in range(21)]), "tags", "at most 20")
    await refused(start(api, "quiet", metadata=["not", "an", "object"]), "metadata_json", "object")
    await refused(start(api, "quiet", metadata={"k": "v" * 5000}), "metadata_json", "4096")
    req = run_pb2.StartRunRequest(
        workspace_id=api.ws, agent_id="quiet", input="go", metadata_json="{nope"
    )
    await refused(api.runs.StartRun(req), "metadata_json")
    await refused(api.runs.ListRuns(run_pb2.ListRunsRequest(workspace_id=api.ws, tag="A B")), "tag")
    bad = run_pb2.ListRunsRequest(workspace_id=api.ws, metadata="no-equals-sign")
    await refused(api.runs.ListRuns(bad), "metadata", "key=value")
