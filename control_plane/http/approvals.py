"""Approval links, signed-in decisions and Slack buttons over HTTP.

A signed-in decision (`POST /approvals/{ws}/id/{approval_id}/decision`) is
the caller's: a person with an OpenID Connect ID token (`Authorization:
Bearer`, verified against the configured issuer) who is a member of the
workspace, an approver key of the workspace, or whoever the HTTP guard
authenticated. Links are capabilities for one approver and one decision; they
never decide a tool that moves money or is high-risk.

A GET never decides anything (mail scanners and chat previews fetch links):
it shows the exact arguments and a form; only the form's POST decides. Pages
send `Referrer-Policy: no-referrer` and load nothing from third parties.
"""

from __future__ import annotations

import html
import json
import time
import uuid
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from control_plane.api.runs import resolve_unknown
from control_plane.approvals import decisions, tokens, unknown_outcome
from control_plane.auth import context as auth_context
from control_plane.auth.oidc import OidcVerifier
from control_plane.auth.resolver import Resolver, bearer
from control_plane.ground import validate
from control_plane.ground.config import ServerConfig
from control_plane.ground.errors import (
    DomainError,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
)
from control_plane.store import approvals as store
from control_plane.store import questions, unknowns
from control_plane.store.db import Pool
from control_plane.triggers import signatures

PAGE_HEADERS = {
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
    ),
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "NOT_FOUND": 404,
    "PERMISSION_DENIED": 403,
    "ABORTED": 409,
    "FAILED_PRECONDITION": 409,
    "ALREADY_EXISTS": 409,
}


def page(status: int, title: str, body: str) -> HTMLResponse:
    doc = (
        "<!doctype html><html><head><meta charset='utf-8'><title>"
        f"{html.escape(title)}</title></head><body style='font-family:sans-serif;max-width:44em'>"
        f"<h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return HTMLResponse(doc, status_code=status, headers=PAGE_HEADERS)


def error_status(exc: DomainError) -> int:
    return HTTP_STATUS.get(exc.code.name, 500)


class ApprovalRoutes:
    def __init__(
        self,
        pool: Pool,
        config: ServerConfig,
        verifier: OidcVerifier | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        """`verifier`: the replica's one OIDC verifier (None: nobody signs in); `resolver`:
        the replica's credential resolver, holding that verifier (default: one of `pool`'s)."""
        self.pool = pool
        self.config = config
        self.verifier = verifier
        # Turns the bearer token into a person (verified, and a member of the workspace,
        # with their role) or an API key's principal, exactly as gRPC calls are resolved.
        self.resolver = resolver or Resolver(pool, verifier)

    def routes(self) -> list[Route]:
        return [
            Route("/approvals/{ws}/{token}", self.show, methods=["GET"]),
            Route("/approvals/{ws}/{token}", self.decide_by_link, methods=["POST"]),
            Route(
                "/approvals/{ws}/id/{approval_id}/decision", self.decide_signed_in, methods=["POST"]
            ),
            Route("/slack/interactions", self.slack_interaction, methods=["POST"]),
        ]

    async def _token(self, ws: str, token: str) -> tuple[Any, Response | None]:
        """The token's approval, or the refusal page for an unknown/used/expired token."""
        if "\x00" in ws:  # no workspace is called that, and Postgres refuses to look
            return None, page(404, "Unknown link", "<p>This approval link is not valid.</p>")
        found = await store.peek_token(self.pool, ws, tokens.digest(token))
        if found is None:
            return None, page(404, "Unknown link", "<p>This approval link is not valid.</p>")
        if found["used_at"] is not None:
            return None, page(410, "Link already used", "<p>Each link decides once.</p>")
        if found["expired"]:
            return None, page(410, "Link expired", "<p>This approval link has expired.</p>")
        return found, None

    async def show(self, request: Request) -> Response:
        ws, token = request.path_params["ws"], request.path_params["token"]
        found, refusal = await self._token(ws, token)
        if refusal:
            return refusal
        a = await store.get(self.pool, ws, found["approval_id"])
        assert a is not None  # a token references its approval (foreign key)
        args = html.escape(json.dumps(json.loads(a.arguments), indent=2, sort_keys=True))
        info = (
            f"<p>Run <code>{a.run_id}</code> wants to call <b>{html.escape(a.tool)}</b>"
            f" with exactly these arguments:</p><pre>{args}</pre>"
            f"<p>SHA-256 <code>{a.arguments_sha256}</code></p>"
        )
        if a.decision is not None:
            return page(
                410,
                "Already decided",
                info + f"<p>{html.escape(a.decision)} by {html.escape(a.decided_by or '')}.</p>",
            )
        why = decisions.needs_sign_in(a)
        if why:
            return page(
                403,
                "Sign-in required",
                info + f"<p>{html.escape(why)}: decide it as a "
                "signed-in approver, not through a link.</p>",
            )
        form = (
            "<form method='post'><input type='hidden' name='decision' value='approve'>"
            "<button>Approve</button></form><form method='post'>"
            "<input type='hidden' name='decision' value='reject'>"
            "<input name='reason' placeholder='reason'><button>Reject</button></form>"
        )
        return page(200, f"Approve {a.tool}?", info + form)

    async def decide_by_link(self, request: Request) -> Response:
        ws, token = request.path_params["ws"], request.path_params["token"]
        form = parse_qs((await request.body()).decode(errors="replace"))
        action = (form.get("decision") or [""])[0]
        if action not in ("approve", "reject"):
            return page(400, "Bad request", "<p>decision must be approve or reject.</p>")
        reason = (form.get("reason") or [""])[0][:1000]
        if "\x00" in reason:  # Postgres refuses it: say so before the link is used up
            return page(400, "Bad request", "<p>reason must not contain a NUL character.</p>")
        found, refusal = await self._token(ws, token)
        if refusal:
            return refusal
        a = await store.get(self.pool, ws, found["approval_id"])
        assert a is not None  # a token references its approval (foreign key)
        why = decisions.needs_sign_in(a)
        if why:
            return page(
                403,
                "Sign-in required",
                f"<p>{html.escape(why)}: a link cannot decide it; sign in.</p>",
            )
        used = await store.use_token(self.pool, ws, tokens.digest(token))
        if used is None:  # another click used it a moment ago
            return page(410, "Link already used", "<p>Each link decides once.</p>")
        decider = decisions.Decider(used["approver"], decisions.LINK)
        req = decisions.Request(ws, found["approval_id"], decider, action, reason=reason)
        try:
            row = await decisions.decide(self.pool, req)
        except DomainError as exc:
            return page(error_status(exc), "Not decided", f"<p>{html.escape(str(exc))}</p>")
        return page(200, "Decided", f"<p>{html.escape(row.tool)}: {row.decision}.</p>")

    async def decide_signed_in(self, request: Request) -> Response:
        """A decision by the caller of `Authorization: Bearer <ID token>` (or the HTTP guard's)."""
        ws = request.path_params["ws"]
        try:
            decider = await self._signed_in(ws, request.headers.get("authorization", ""))
        except DomainError as exc:
            return JSONResponse({"error": str(exc)}, status_code=error_status(exc))
        try:
            approval_id = uuid.UUID(request.path_params["approval_id"])
            body = validate.json_value("body", await request.body())
        except (ValueError, InvalidArgument):
            return JSONResponse({"error": "malformed approval id or JSON body"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
        edited = body.get("arguments")
        req = decisions.Request(
            ws,
            approval_id,
            decider,
            str(body.get("decision", "")),
            reason=str(body.get("reason", ""))[:1000],
            edited_arguments_json=json.dumps(edited) if edited is not None else "",
        )
        return await self._json_decision(req)

    async def _slack_answer(self, user: str, action: dict[str, Any]) -> Response:
        """A Slack button's answer to an unknown outcome: only a Slack user its question
        names answers, recorded as `slack:<user>`; the first answer wins."""
        ws, run_text, seq_text = action["value"].split(":", 2)
        run_id, seq = uuid.UUID(run_text), int(seq_text)
        try:
            q = await questions.get(self.pool, ws, run_id, seq)
            if q is None or user not in q.slack_recipients:
                raise PermissionDenied(f"Slack user {user!r} is not asked about step {seq}")
            wanted = unknowns.Decision(ws, run_id, seq, action["action_id"], f"slack:{user}")
            _, step = await resolve_unknown(self.pool, wanted)
        except DomainError as exc:
            return JSONResponse({"error": str(exc)}, status_code=error_status(exc))
        return JSONResponse(
            {
                "run_id": str(run_id),
                "seq": step.seq,
                "decision": wanted.decision,
                "decided_by": wanted.decided_by,
            }
        )

    async def _signed_in(self, ws: str, authorization: str) -> decisions.Decider:
        """The decider: the principal an HTTP guard set, else the bearer token's (a signed-in
        person who is a member of `ws`, or an approver key of `ws`)."""
        try:
            who = auth_context.current()
        except Unauthenticated:
            if bearer(authorization) is None:
                raise Unauthenticated("sign in: send Authorization: Bearer <ID token>") from None
            who = await self.resolver.resolve(authorization, ws)
        if who.workspace_id != ws:
            raise PermissionDenied("this credential is for another workspace")
        return decisions.Decider.of(who)

    async def _json_decision(self, req: decisions.Request) -> Response:
        try:
            row = await decisions.decide(self.pool, req)
        except DomainError as exc:
            return JSONResponse({"error": str(exc)}, status_code=error_status(exc))
        return JSONResponse(
            {
                "approval_id": str(row.approval_id),
                "decision": row.decision,
                "decided_by": row.decided_by,
            }
        )

    async def slack_interaction(self, request: Request) -> Response:
        body = await request.body()
        secret = self.config.slack_signing_secret
        if not secret:
            return JSONResponse(
                {"error": "Slack signing secret is not configured"}, status_code=401
            )
        # The same v0 scheme (timestamped HMAC, constant time, 5-minute window) as Slack triggers.
        try:
            signatures.verify(
                "slack",
                signatures.Delivery.of(body, request.headers),
                [secret.decode()],
                now=time.time(),
                tolerance=signatures.SCHEMES["slack"].default_tolerance,
            )
        except signatures.SignatureError as exc:
            return JSONResponse({"error": str(exc)}, status_code=401)
        try:
            payload = validate.json_value("payload", parse_qs(body.decode())["payload"][0])
            action = payload["actions"][0]
            if action["action_id"] in unknown_outcome.ANSWERS:
                return await self._slack_answer(str(payload["user"]["id"]), action)
            ws, approval_id = action["value"].split(":", 1)
            decider = decisions.Decider(str(payload["user"]["id"]), decisions.SLACK)
            req = decisions.Request(ws, uuid.UUID(approval_id), decider, action["action_id"])
        except (KeyError, IndexError, ValueError, TypeError, InvalidArgument):
            return JSONResponse({"error": "malformed interaction payload"}, status_code=400)
        return await self._json_decision(req)
