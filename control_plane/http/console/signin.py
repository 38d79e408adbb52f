"""Signing in (an API key, or OpenID Connect for people) and out.

The sign-in forms' CSRF tokens are bound to a pre-session cookie, so a page
elsewhere cannot sign the browser in as someone else (login CSRF).
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from control_plane.auth.principal import Kind, Principal
from control_plane.ground import validate
from control_plane.ground.errors import DomainError, InvalidArgument, PermissionDenied
from control_plane.http.console import security
from control_plane.http.console.oidc_flow import FLOW_SECONDS, Flow
from control_plane.http.console.sessions import SESSION_SECONDS
from control_plane.http.console.web import (
    PREFIX,
    Console,
    check_form,
    error_page,
    render,
    see_other,
)
from control_plane.http.errors import HTTP_STATUS

SIGNIN_SECONDS = 3600


def safe_next(value: str) -> str:
    """Where to go after sign-in: a console path, never another site."""
    target = unquote(value or "")
    ok = target.startswith(f"{PREFIX}/") and not target.startswith("//") and "\\" not in target
    return target if ok else f"{PREFIX}/runs"


class SignInPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    def _redirect_uri(self, request: Request) -> str:
        return f"{str(request.base_url).rstrip('/')}{PREFIX}/callback"

    async def form(self, request: Request, *, status: int = 200, error: str = "") -> Response:
        cookie = request.cookies.get(security.SIGNIN_COOKIE) or security.new_token()
        response = render(
            request,
            "signin.html",
            status=status,
            csrf=security.csrf_token(cookie),
            who=None,
            sso=self.c.flow is not None,
            error=error,
            next=safe_next(request.query_params.get("next", "")),
        )
        security.set_cookie(response, request, security.SIGNIN_COOKIE, cookie, SIGNIN_SECONDS)
        idp = security.origin(self.c.flow.verifier.issuer) if self.c.flow is not None else ""
        return security.harden(response, form_action=idp)

    async def _checked(self, request: Request) -> Response | None:
        return await check_form(request, request.cookies.get(security.SIGNIN_COOKIE))

    async def with_key(self, request: Request) -> Response:
        refused = await self._checked(request)
        if refused is not None:
            return security.harden(refused)
        form = request.state.form
        try:
            who = await self.c.resolver.resolve(f"Bearer {form.get('key', '').strip()}")
            if who.kind is not Kind.KEY or who.workspace_id is None:
                raise PermissionDenied("the console takes a workspace API key")
        except DomainError as exc:
            return await self.form(request, status=HTTP_STATUS.get(exc.code, 401), error=str(exc))
        return await self._signed_in(request, who, safe_next(form.get("next", "")))

    async def with_oidc(self, request: Request) -> Response:
        refused = await self._checked(request)
        if refused is not None:
            return security.harden(refused)
        if self.c.flow is None:
            return await self.form(request, status=404, error="sign-in with SSO is not set up")
        try:
            ws = validate.slug("workspace", request.state.form.get("workspace", "").strip())
            url, flow = await self.c.flow.begin(ws, self._redirect_uri(request))
        except DomainError as exc:
            return await self.form(request, status=HTTP_STATUS.get(exc.code, 400), error=str(exc))
        response = see_other(url)
        security.set_cookie(
            response, request, security.FLOW_COOKIE, flow.cookie(), FLOW_SECONDS, same_site="lax"
        )
        return security.harden(response)

    async def callback(self, request: Request) -> Response:
        if self.c.flow is None:
            return error_page(request, 404, "Not found", "sign-in with SSO is not set up")
        q = request.query_params
        try:
            if q.get("error"):
                raise InvalidArgument("error", f"the identity provider said {q['error']}")
            flow = Flow.of_cookie(request.cookies.get(security.FLOW_COOKIE))
            redirect = self._redirect_uri(request)
            who = await self.c.flow.finish(flow, q.get("state", ""), q.get("code", ""), redirect)
        except DomainError as exc:
            return await self.form(request, status=HTTP_STATUS.get(exc.code, 401), error=str(exc))
        return await self._signed_in(request, who, f"{PREFIX}/runs", cross_site=True)

    async def _signed_in(
        self, request: Request, who: Principal, target: str, cross_site: bool = False
    ) -> Response:
        """Start the session; go on to `target`. After the IdP's redirect (`cross_site`) the
        browser would not send a SameSite=Strict cookie on a redirect, so a page links on."""
        token = await self.c.sessions.start(who)
        response: Response = see_other(target)
        if cross_site:
            response = HTMLResponse(
                f"<!doctype html><meta http-equiv='refresh' content='0;url={target}'>"
                f"<p>Signed in. <a href='{target}'>Continue</a></p>"
            )
        security.set_cookie(response, request, security.SESSION_COOKIE, token, SESSION_SECONDS)
        security.clear_cookie(response, request, security.FLOW_COOKIE)
        return security.harden(response)

    async def sign_out(self, request: Request) -> Response:
        await self.c.sessions.end(request)
        response = see_other(f"{PREFIX}/signin")
        security.clear_cookie(response, request, security.SESSION_COOKIE)
        return response
