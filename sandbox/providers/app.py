"""The provider sandbox app: every provider's endpoints behind one recorder and fault table."""

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandbox.faults import (
    DroppedResponse,
    FaultSpecError,
    FaultTable,
    ProviderFault,
    retry_after_headers,
)
from sandbox.json_http import JSONResponse, read_json
from sandbox.oauth import Checked, OAuthServer
from sandbox.providers.base import Endpoint, Provider, ProviderRequest, error
from sandbox.providers.chat import ChatProvider
from sandbox.providers.crm import CrmProvider
from sandbox.providers.echo import EchoProvider
from sandbox.providers.mail import MailProvider
from sandbox.providers.payments import PaymentsProvider
from sandbox.providers.shop import ShopProvider
from sandbox.providers.slack_api import SlackApiProvider
from sandbox.providers.web import WebProvider
from sandbox.request_log import RequestLog

# The registry: a new provider is a new module plus one line here.
PROVIDERS: tuple[Callable[[], Provider], ...] = (
    ChatProvider,
    CrmProvider,
    EchoProvider,
    MailProvider,
    PaymentsProvider,
    ShopProvider,
    SlackApiProvider,
    WebProvider,
)


class ProviderSandbox:
    """State of one provider server: the providers, the request log, the armed faults."""

    def __init__(self, providers: Iterable[Provider]) -> None:
        self.providers = {provider.name: provider for provider in providers}
        self.log = RequestLog()
        self.faults = FaultTable(list(self.providers))
        # Issues and checks the bearer tokens of connected accounts (sandbox/oauth.py).
        self.oauth = OAuthServer(list(self.providers))

    def routes(self) -> list[Route]:
        routes = [
            Route("/_sandbox/requests", self.requests, methods=["GET", "DELETE"]),
            Route("/_sandbox/faults", self.faults_endpoint, methods=["GET", "POST", "DELETE"]),
            Route("/_sandbox/effects", self.effects, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            *self.oauth.routes(),
        ]
        for provider in self.providers.values():
            for endpoint in provider.endpoints():
                routes.append(
                    Route(endpoint.path, self._route(provider, endpoint), methods=[endpoint.method])
                )
        return routes

    def _route(
        self, provider: Provider, endpoint: Endpoint
    ) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            call = await _provider_request(request)
            if not endpoint.recorded:
                return await _invoke(endpoint, call)
            return await self._serve(provider.name, endpoint, call)

        return route

    async def _serve(self, provider: str, endpoint: Endpoint, call: ProviderRequest) -> Response:
        # A provider that checks its own credentials (Slack's bot tokens) skips the grants.
        own = getattr(self.providers[provider], "own_auth", False)
        checked = Checked() if own else self.oauth.check(provider, call.method, call.headers)
        if checked.refusal is not None:  # refused before any fault or side effect
            self._record(provider, call, checked.refusal.status_code, None, checked)
            return checked.refusal
        fault = self.faults.take(provider, call.path, call.idempotency_key)
        mode = fault.mode if fault else None
        if fault and mode in ("error", "rate_limit"):
            await asyncio.sleep(fault.delay_seconds)
        elif fault and mode == "delay":
            call.processing.delay = fault.delay_seconds  # spent inside the provider's work
        response = _refusal(fault) or await _invoke(endpoint, call)
        # Recorded before a dropped response hangs, so a test sees the side effect
        # while the client is still waiting for an answer that will never come.
        self._record(provider, call, response.status_code, mode, checked)
        if fault and mode == "drop_response":
            await asyncio.sleep(fault.delay_seconds)
            return DroppedResponse()
        return response

    def _record(
        self, provider: str, call: ProviderRequest, status: int, mode: str | None, checked: Checked
    ) -> None:
        self.log.record(
            provider=provider,
            method=call.method,
            path=call.path,
            query=dict(call.query),
            idempotency_key=call.idempotency_key,
            body=call.body,
            status=status,
            fault=mode,
            # With a bearer token: its account and which token (grant/generation), never
            # the token itself. Calls without one keep the entry as it always was.
            **(
                {"account": checked.account, "token_id": checked.token_id}
                if checked.token_id
                else {}
            ),
        )

    async def requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.log.clear()
            for provider in self.providers.values():
                provider.reset()
        return JSONResponse({"requests": self.log.entries()})

    async def effects(self, request: Request) -> Response:
        """Every side effect of every provider (or of `?provider=`), each with its key."""
        wanted = request.query_params.get("provider")
        found = [
            effect
            for provider in self.providers.values()
            if wanted in (None, provider.name)
            for effect in getattr(provider, "effects", list)()
        ]
        return JSONResponse({"effects": found})

    async def faults_endpoint(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                self.faults.arm(await read_json(request))
            except FaultSpecError as exc:
                return error(400, str(exc))
        elif request.method == "DELETE":
            self.faults.clear()
        return JSONResponse({"faults": self.faults.to_json()})


def create_app(providers: Iterable[Provider] | None = None) -> Starlette:
    """The provider sandbox app; its state is reachable as `app.state.sandbox`."""
    sandbox = ProviderSandbox(providers if providers is not None else [new() for new in PROVIDERS])
    app = Starlette(routes=sandbox.routes())
    app.state.sandbox = sandbox
    return app


def _refusal(fault: ProviderFault | None) -> Response | None:
    """The answer of a fault that stops the call before any side effect."""
    if fault is None:
        return None
    if fault.mode == "error":
        return error(fault.status, "sandbox fault: provider error")
    if fault.mode == "rate_limit":
        response = error(fault.status, "sandbox fault: rate limited")
        response.headers.update(retry_after_headers(fault.retry_after))
        return response
    return None


async def _invoke(endpoint: Endpoint, call: ProviderRequest) -> Response:
    response = endpoint.handler(call)
    if inspect.isawaitable(response):
        response = await response
    await call.work()  # whatever processing time the handler did not spend
    return response


async def _provider_request(request: Request) -> ProviderRequest:
    return ProviderRequest(
        method=request.method,
        path=request.url.path,
        query=request.query_params,
        headers=request.headers,
        body=await read_json(request),
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})
