"""The approval HTTP routes (links, Slack buttons, signed-in decisions) served in-process.

Pytest fixtures shared by the approval tests (`pool`, `config`, `http`); a test module
imports them (under other names, so that its parameters shadow nothing):

    from tests.harness.approval_routes import config_fixture, http_fixture, pool_fixture  # noqa: F401

`config` is a ServerConfig against the test database, the sandbox providers (where
notifications go) and the sandbox IdP; `http` an httpx client of ApprovalRoutes on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from starlette.applications import Starlette

from control_plane.auth import oidc
from control_plane.ground.config import ServerConfig
from control_plane.http.approvals import ApprovalRoutes
from tests.harness.processes import SandboxServer

SLACK_SECRET = b"slack-signing-secret-for-tests"
PUBLIC_URL = "http://approvals.test"


@pytest.fixture(name="pool")
async def pool_fixture(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(db_url, min_size=2, max_size=16)
    yield p
    await p.close()


@pytest.fixture(name="config")
def config_fixture(
    db_url: str, sandbox_providers: SandboxServer, sandbox_idp: SandboxServer
) -> ServerConfig:
    return ServerConfig(
        database_url=db_url,
        listen="127.0.0.1:0",
        notify_url=sandbox_providers.url,
        public_url=PUBLIC_URL,
        oidc_issuer=sandbox_idp.url,
        slack_signing_secret=SLACK_SECRET,
    )


@pytest.fixture(name="http")
async def http_fixture(
    pool: asyncpg.Pool, config: ServerConfig
) -> AsyncIterator[httpx.AsyncClient]:
    verifier = oidc.from_settings(config.oidc_issuer, config.oidc_audience)
    routes = ApprovalRoutes(pool, config, verifier)
    app = Starlette(routes=routes.routes())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    assert verifier is not None
    await verifier.close()
