"""Rendering and the signed-in guard every console page goes through.

`Console.page(need, handler)` serves `handler` only to a request whose session
cookie names a live session whose principal holds `need`; a POST must also carry
the form's CSRF token. The handler runs inside `context.acting_as(principal)`;
domain errors become an error page with their HTTP status.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import grpc
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from control_plane.auth import access, audit
from control_plane.auth import context as auth_context
from control_plane.auth.principal import Principal
from control_plane.auth.resolver import Resolver
from control_plane.ground.config import ServerConfig
from control_plane.ground.errors import DomainError, status_for
from control_plane.http.console import security
from control_plane.http.console.oidc_flow import CodeFlow
from control_plane.http.console.sessions import Sessions
from control_plane.http.errors import HTTP_STATUS
from control_plane.store.db import Pool

log = logging.getLogger(__name__)

PREFIX = "/console"
MAX_FORM_BYTES = 256 * 1024
TEMPLATES = Path(__file__).parent / "templates"
ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)

Handler = Callable[[Request], Awaitable[Response]]


class FormTooLarge(Exception):
    pass


@dataclass
class Console:
    """What the console's pages share: the pool, settings, sessions and sign-in."""

    pool: Pool
    config: ServerConfig
    resolver: Resolver
    sessions: Sessions
    flow: CodeFlow | None  # None: no OIDC issuer configured, keys only
    on_runnable: Callable[[], None]

    def page(self, need: access.Need, handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapper(request: Request) -> Response:
            with audit.request(audit.new_request_id(request.headers.get("x-request-id"))):
                return security.harden(await self._serve(need, handler, request))

        return wrapper

    async def _serve(self, need: access.Need, handler: Handler, request: Request) -> Response:
        who = await self.sessions.principal(request)
        if who is None:
            return to_sign_in(request)
        cookie = request.cookies[security.SESSION_COOKIE]
        request.state.who, request.state.csrf = who, security.csrf_token(cookie)
        if request.method == "POST":
            refused = await check_form(request, cookie)
            if refused is not None:
                return refused
        if not access.allows(need, who):
            message = f"{who.label} (role {who.role}) may not {need.value} here"
            return error_page(request, 403, "Not allowed", message)
        with auth_context.acting_as(who):
            try:
                return await handler(request)
            except DomainError as exc:
                return error_page(request, HTTP_STATUS.get(exc.code, 500), "Refused", str(exc))
            except Exception as exc:  # noqa: BLE001 - the console's one place for the unexpected
                code, message = status_for(exc)  # logs it with a request id
                status = 500 if code == grpc.StatusCode.INTERNAL else HTTP_STATUS.get(code, 500)
                return error_page(request, status, "Something went wrong", message)


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (first value of each field), refused past MAX_FORM_BYTES."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormTooLarge()
    return {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items()}


async def check_form(request: Request, bound_to: str | None) -> Response | None:
    """Parse the POST's form into request.state.form; a refusal page when it has no valid
    CSRF token for `bound_to` (the session or sign-in cookie) or is too large."""
    try:
        form = await read_form(request)
    except FormTooLarge:
        return error_page(request, 413, "Too large", "the form is larger than 256 KiB")
    if not security.csrf_ok(bound_to, form.get(security.CSRF_FIELD)):
        return error_page(
            request, 403, "Refused", "the form's CSRF token is missing or wrong; reload the page"
        )
    request.state.form = form
    return None


def to_sign_in(request: Request) -> Response:
    if request.method != "GET":
        return error_page(request, 401, "Sign in", "your session has ended; sign in again")
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{PREFIX}/signin?next={quote(target)}", status_code=303)


def who_of(request: Request) -> Principal | None:
    return getattr(request.state, "who", None)


def render(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
    values.setdefault("who", who_of(request))
    values.setdefault("csrf", getattr(request.state, "csrf", ""))
    values.setdefault("path", request.url.path)
    html = ENV.get_template(template).render(prefix=PREFIX, **values)
    return HTMLResponse(html, status_code=status)


def fragment(template: str, macro: str, *args: Any, **values: Any) -> str:
    """One macro of a template rendered alone (a timeline row for the live feed)."""
    module = ENV.get_template(template).make_module({"prefix": PREFIX, **values})
    return str(getattr(module, macro)(*args))


def error_page(request: Request, status: int, title: str, message: str) -> Response:
    return security.harden(
        render(request, "error.html", status=status, title=title, message=message)
    )


def see_other(path: str) -> Response:
    return RedirectResponse(path, status_code=303)
