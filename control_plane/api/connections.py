"""ConnectionService (connected accounts, never their tokens) and the executor's token call."""

from __future__ import annotations

from urllib.parse import urlencode

import grpc

from agentrun.v1 import connection_pb2 as pb
from agentrun.v1 import connection_pb2_grpc, executor_pb2
from control_plane.auth import context as auth_context
from control_plane.connections.revocation import Revocations
from control_plane.connections.tokens import ConnectionTokens
from control_plane.ground import convert, validate
from control_plane.ground.errors import NotFound, PermissionDenied
from control_plane.store import connections as store
from control_plane.store.connections import StoredConnection
from control_plane.store.db import Pool

START_PATH = "/connections/{workspace_id}/{provider}/start"


def to_proto(row: StoredConnection) -> pb.Connection:
    msg = pb.Connection(
        workspace_id=row.workspace_id,
        connection_id=row.connection_id,
        provider=row.provider,
        account=row.account,
        owner=row.owner,
        scopes=list(row.scopes),
        status=row.status,
        status_reason=row.status_reason,
    )
    if (expiry := convert.timestamp(row.access_expires_at)) is not None:
        msg.access_expire_time.CopyFrom(expiry)
    return msg


class ConnectionServicer(connection_pb2_grpc.ConnectionServiceServicer):
    def __init__(self, pool: Pool, public_url: str, revocations: Revocations) -> None:
        self._pool = pool
        self._public_url = public_url
        self._revocations = revocations

    async def _get(self, workspace_id: str, connection_id: str) -> StoredConnection:
        cid = str(validate.run_id("connection_id", connection_id))
        row = await store.get(self._pool, workspace_id, cid)
        if row is None:
            raise NotFound(f"connection {cid} not found")
        return row

    async def ListConnections(
        self, request: pb.ListConnectionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConnectionsResponse:
        ws = auth_context.workspace(request.workspace_id)
        rows = await store.list_for(self._pool, ws)
        return pb.ListConnectionsResponse(connections=[to_proto(row) for row in rows])

    async def GetConnection(
        self, request: pb.GetConnectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetConnectionResponse:
        ws = auth_context.workspace(request.workspace_id)
        return pb.GetConnectionResponse(
            connection=to_proto(await self._get(ws, request.connection_id))
        )

    async def RevokeConnection(
        self, request: pb.RevokeConnectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.RevokeConnectionResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, request.connection_id)
        # At the provider too (RFC 7009); revoked here whatever it answers.
        await self._revocations.revoke(row)
        return pb.RevokeConnectionResponse(
            connection=to_proto(await self._get(ws, row.connection_id))
        )

    async def GetReconnectLink(
        self, request: pb.GetReconnectLinkRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetReconnectLinkResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, request.connection_id)
        path = START_PATH.format(workspace_id=ws, provider=row.provider)
        query = urlencode(
            {
                "connection_id": row.connection_id,
                "login_hint": row.account,
                "scope": " ".join(row.scopes),
            }
        )
        return pb.GetReconnectLinkResponse(url=f"{self._public_url}{path}?{query}")


async def connection_token(
    pool: Pool, tokens: ConnectionTokens, request: executor_pb2.GetConnectionTokenRequest
) -> executor_pb2.GetConnectionTokenResponse:
    """ExecutorService.GetConnectionToken: for a run this executor holds, whose agent
    version names the connection. The answer is the one place a token leaves the store."""
    who = auth_context.current()
    lease = request.lease
    ws = validate.text("lease.workspace_id", lease.workspace_id, max_bytes=200, required=True)
    run_id = str(validate.run_id("lease.run_id", lease.run_id))
    cid = str(validate.run_id("connection_id", request.connection_id))
    if not who.serves(ws):
        raise PermissionDenied(f"this executor does not serve workspace {ws!r}")
    if not await store.lease_allows(pool, ws, run_id, lease.epoch, cid):
        raise PermissionDenied(
            "the run is not held under this lease or does not use this connection"
        )
    token = await tokens.for_call(ws, cid)
    answer = executor_pb2.GetConnectionTokenResponse(
        access_token=token.access_token, account=token.account, scopes=list(token.scopes)
    )
    if (expiry := convert.timestamp(token.expires_at)) is not None:
        answer.expire_time.CopyFrom(expiry)
    return answer
