"""Cookies, CSRF tokens and the security headers of every console response."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

SESSION_COOKIE = "agentrun_console"
# Before sign-in: the cookie the sign-in forms' CSRF tokens are bound to.
SIGNIN_COOKIE = "agentrun_signin"
# The authorization-code flow's state, nonce and PKCE verifier, between redirect and callback.
FLOW_COOKIE = "agentrun_oidc_flow"
CSRF_FIELD = "csrf"


def csp(form_action: str = "") -> str:
    """The pages' policy. `form_action`: one more origin a form may lead to (the sign-in
    form redirects to the identity provider, which form-action also governs)."""
    return (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        f"connect-src 'self'; form-action 'self'{' ' + form_action if form_action else ''}; "
        "frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    )


HEADERS = {
    "Content-Security-Policy": csp(),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def new_token() -> str:
    """256 random bits, URL-safe: a session, sign-in or flow token."""
    return secrets.token_urlsafe(32)


def digest(token: str) -> bytes:
    """What the database keeps of a session token."""
    return hashlib.sha256(token.encode()).digest()


def csrf_token(bound_to: str) -> str:
    """The CSRF token of forms on a page served to the holder of cookie value `bound_to`.

    A keyed hash of the cookie: a page from another origin can neither read the
    HttpOnly cookie nor this page, so it cannot produce the token.
    """
    return hmac.new(bound_to.encode(), b"agentrun console csrf", hashlib.sha256).hexdigest()


def csrf_ok(bound_to: str | None, sent: str | None) -> bool:
    if not bound_to or not sent:
        return False
    return same_text(csrf_token(bound_to), sent)


def same_text(a: str, b: str) -> bool:
    """Constant-time equality of two strings of any characters, as their UTF-8 bytes:
    `hmac.compare_digest` raises TypeError for a str with a non-ASCII character, so a
    form or query value of the caller's must not reach it as text."""
    return hmac.compare_digest(
        a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    )


def _plain_loopback(request: Request) -> bool:
    """Plain HTTP to 127.0.0.1/::1/localhost: a developer's machine, where Secure would be
    dropped by clients that do not treat loopback as a secure origin."""
    if request.url.scheme == "https":
        return False
    host = request.url.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def set_cookie(
    response: Response,
    request: Request,
    name: str,
    value: str,
    max_age: int,
    same_site: str = "strict",
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/console",
        httponly=True,
        secure=not _plain_loopback(request),
        samesite=same_site,  # type: ignore[arg-type]
    )


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(
        name,
        path="/console",
        httponly=True,
        secure=not _plain_loopback(request),
        samesite="strict",
    )


def origin(url: str) -> str:
    """scheme://host[:port] of `url`."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def harden(response: Response, form_action: str = "") -> Response:
    if form_action:
        response.headers["Content-Security-Policy"] = csp(form_action)
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    return response
