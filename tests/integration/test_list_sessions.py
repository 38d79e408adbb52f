"""ListSessions (issue 42): a workspace's sessions, newest first, in pages that neither skip
nor repeat one while sessions are created and get turns, over gRPC and HTTP alike."""

from __future__ import annotations

import grpc
import httpx
import pytest

from agentrun.v1 import session_pb2, session_pb2_grpc
from tests.harness import auth
from tests.harness.agentrun_api import Api

WS = "ws"


async def test_sessions_are_listed_newest_first_in_pages(db_url, control_plane) -> None:
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("a", "demo", [])
    await api.publish("b", "demo", [])
    stub = session_pb2_grpc.SessionServiceStub(api.channel)
    made = []
    for i, agent in enumerate(["a", "b", "a", "a", "b"]):
        request = session_pb2.CreateSessionRequest(workspace_id=WS, agent_id=agent, title=f"s{i}")
        made.append((await stub.CreateSession(request)).session.session_id)

    seen, token, pages = [], "", 0
    while True:
        page = await stub.ListSessions(
            session_pb2.ListSessionsRequest(workspace_id=WS, page_size=2, page_token=token)
        )
        seen += [s.session_id for s in page.sessions]
        pages += 1
        if pages == 1:  # a session made between pages comes first, never inside the paging
            await stub.CreateSession(
                session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="a")
            )
        token = page.next_page_token
        if not token:
            break
    assert seen == made[::-1] and pages == 3
    only_b = await stub.ListSessions(session_pb2.ListSessionsRequest(workspace_id=WS, agent_id="b"))
    assert [s.session_id for s in only_b.sessions] == [made[4], made[1]]
    assert {s.agent_id for s in only_b.sessions} == {"b"} and only_b.next_page_token == ""

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ListSessions(session_pb2.ListSessionsRequest(workspace_id=WS, page_token="x"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token" in (refused.value.details() or "")

    key = await auth.workspace_key(db_url, WS, role="reader")
    async with httpx.AsyncClient(headers=auth.bearer(key), timeout=30) as http:
        answer = await http.get(f"{cp.http_url}/v1/workspaces/{WS}/sessions?page_size=2")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["sessions"]) == 2 and body["next_page_token"]
    await api.close()
