"""Test helpers for triggers and sessions: gRPC stubs, signed HTTP deliveries, table counts."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import grpc
import httpx
from google.protobuf.duration_pb2 import Duration

from agentrun.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    session_pb2_grpc,
    trigger_pb2,
    trigger_pb2_grpc,
)
from control_plane.triggers.signatures import sign
from tests.harness import auth

SCHEME = {
    "hmac_sha256": trigger_pb2.SIGNATURE_SCHEME_HMAC_SHA256,
    "stripe": trigger_pb2.SIGNATURE_SCHEME_STRIPE,
    "slack": trigger_pb2.SIGNATURE_SCHEME_SLACK,
    "github": trigger_pb2.SIGNATURE_SCHEME_GITHUB,
    "standard_webhooks": trigger_pb2.SIGNATURE_SCHEME_STANDARD_WEBHOOKS,
}


def seconds(value: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


class TriggerApi:
    """AgentService, TriggerService and SessionService stubs over one channel, for one workspace."""

    def __init__(self, address: str, workspace: str = "ws", key: str | None = None) -> None:
        self.key = key
        self.channel = auth.channel(address, key)
        self.agents = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.triggers = trigger_pb2_grpc.TriggerServiceStub(self.channel)
        self.sessions = session_pb2_grpc.SessionServiceStub(self.channel)
        self.ws = workspace

    @classmethod
    async def connect(cls, address: str, db_url: str, workspace: str = "ws") -> TriggerApi:
        """A TriggerApi calling with a new admin key of `workspace` (created if new)."""
        return cls(address, workspace, await auth.workspace_key(db_url, workspace))

    async def close(self) -> None:
        await self.channel.close()

    async def publish(
        self, agent_id: str, model: str = "writer", tools: tuple[str, ...] = ()
    ) -> None:
        try:
            await self.agents.CreateAgent(
                agent_pb2.CreateAgentRequest(workspace_id=self.ws, agent_id=agent_id)
            )
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        spec = agent_pb2.AgentSpec(model=model, instructions="test agent", tools=list(tools))
        await self.agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(workspace_id=self.ws, agent_id=agent_id, spec=spec)
        )

    async def create(self, trigger_id: str, agent_id: str, **source: Any) -> tuple[Any, str]:
        """CreateTrigger with one source (webhook=…, schedule=…, mail=…, mail_push=…)."""
        filters = source.pop("filters", [])
        secret = source.pop("secret", "")
        resp = await self.triggers.CreateTrigger(
            trigger_pb2.CreateTriggerRequest(
                workspace_id=self.ws,
                trigger_id=trigger_id,
                agent_id=agent_id,
                filters=filters,
                secret=secret,
                **source,
            )
        )
        return resp.trigger, resp.secret

    async def webhook(self, trigger_id: str, agent_id: str, scheme: str, **kw: Any) -> str:
        """A webhook trigger with the scheme's defaults; returns its secret."""
        extra = {"filters": kw.pop("filters", []), "secret": kw.pop("secret", "")}
        source = trigger_pb2.WebhookSource(scheme=SCHEME[scheme], **kw)
        _, secret = await self.create(trigger_id, agent_id, webhook=source, **extra)
        return secret

    async def events(self, trigger_id: str) -> list[trigger_pb2.TriggerEvent]:
        resp = await self.triggers.ListTriggerEvents(
            trigger_pb2.ListTriggerEventsRequest(workspace_id=self.ws, trigger_id=trigger_id)
        )
        return list(resp.events)

    async def rotate(self, trigger_id: str, grace: float | None = None) -> str:
        req = trigger_pb2.RotateTriggerSecretRequest(workspace_id=self.ws, trigger_id=trigger_id)
        if grace is not None:
            req.grace.CopyFrom(seconds(grace))
        return (await self.triggers.RotateTriggerSecret(req)).secret


def signed(
    scheme: str,
    secret: str,
    doc: Any,
    delivery_id: str,
    *,
    timestamp: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """A JSON body and the headers its sender would send (signature and delivery id)."""
    body = json.dumps(doc).encode()
    headers = sign(
        scheme, secret, body, timestamp=timestamp or int(time.time()), delivery_id=delivery_id
    )
    headers["Content-Type"] = "application/json"
    if scheme == "github":
        headers["X-GitHub-Delivery"] = delivery_id
    elif scheme == "hmac_sha256":
        headers["X-Webhook-Id"] = delivery_id
    return body, headers


async def post(
    client: httpx.AsyncClient, workspace: str, trigger_id: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    return await client.post(f"/hooks/{workspace}/{trigger_id}", content=body, headers=headers)


async def count(conn: asyncpg.Connection, table: str, **where: Any) -> int:
    """Rows of `table` matching the equalities in `where` (test-only raw SQL)."""
    clauses = " AND ".join(f"{column} = ${i}" for i, column in enumerate(where, start=1))
    sql = f"SELECT count(*) FROM {table}" + (f" WHERE {clauses}" if clauses else "")
    return await conn.fetchval(sql, *where.values())
