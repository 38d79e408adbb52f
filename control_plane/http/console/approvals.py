"""The approvals inbox: the exact arguments, approve, reject with a reason, or edit.

Decisions go through `approvals.decisions.decide` with the signed-in principal
as the decider (`Decider.of`), so the rules (on the list, a signed-in person
for money-moving or high-risk tools, four eyes) are the gRPC door's. An edit is
shown as a diff and confirmed before it is recorded.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response

from control_plane.approvals import decisions, policy
from control_plane.auth import context as auth_context
from control_plane.auth.principal import Capability
from control_plane.ground import validate
from control_plane.ground.errors import DomainError, InvalidArgument, NotFound
from control_plane.http.console import timeline
from control_plane.http.console.web import Console, render, see_other
from control_plane.http.errors import HTTP_STATUS
from control_plane.store import approvals as store

STATES = ("pending", "approved", "rejected", "edited", "expired", "closed")
MAX_REASON_BYTES = 1000


def may_decide(row: store.Approval) -> bool:
    """Whether the signed-in principal is one who may decide this pending approval."""
    who = auth_context.current()
    if row.decision is not None or not who.may(Capability.DECIDE):
        return False
    try:
        decider = decisions.Decider.of(who)
    except DomainError:
        return False
    return decisions.on_list(decider, list(row.approvers))


class ApprovalPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    async def _approval(self, request: Request) -> store.Approval:
        approval_id = validate.run_id("approval_id", request.path_params["approval_id"])
        row = await store.get(self.c.pool, auth_context.workspace(""), approval_id)
        if row is None:
            raise NotFound(f"approval {approval_id} not found")
        return row

    async def inbox(self, request: Request) -> Response:
        state = request.query_params.get("state", "pending")
        if state not in (*STATES, "all"):
            raise InvalidArgument("state", f"must be one of {', '.join(STATES)} or all")
        rows, _ = await store.list_page(
            self.c.pool,
            auth_context.workspace(""),
            approver=None,
            state=None if state == "all" else state,
            after=None,
            limit=200,
        )
        mine = {r.approval_id for r in rows if may_decide(r)}
        return render(request, "approvals.html", rows=rows, state=state, states=STATES, mine=mine)

    async def show(
        self,
        request: Request,
        *,
        status: int = 200,
        error: str = "",
        edited: str = "",
        note: str = "",
    ) -> Response:
        row = await self._approval(request)
        original = json.loads(row.arguments)
        review = timeline.diff(original, json.loads(edited)) if edited else []
        after = json.loads(row.edited_arguments) if row.edited_arguments else None
        return render(
            request,
            "approval.html",
            status=status,
            a=row,
            arguments=timeline.pretty(original),
            origins=policy.origins_of(row),
            decided_diff=timeline.diff(original, after) if after is not None else [],
            may_decide=may_decide(row),
            sign_in_only=decisions.needs_sign_in(row),
            error=error,
            review=review,
            edited=edited,
            note=note,
        )

    async def decide(self, request: Request) -> Response:
        """approve | reject (with a reason) | review (an edit, shown as a diff) | edit."""
        row = await self._approval(request)
        form = request.state.form
        action = form.get("action", "")
        if action == "review":
            return await self._review(request, row, form.get("arguments", ""), form.get("note", ""))
        reason = validate.text("reason", form.get("reason", ""), max_bytes=MAX_REASON_BYTES)
        if action == "reject" and not reason.strip():
            return await self.show(request, status=400, error="reason: say why you reject it")
        req = decisions.Request(
            row.workspace_id,
            row.approval_id,
            decisions.Decider.of(auth_context.current()),
            action,
            reason=reason,
            edited_arguments_json=form.get("arguments", ""),
            note=validate.text("note", form.get("note", ""), max_bytes=MAX_REASON_BYTES),
        )
        try:
            await decisions.decide(self.c.pool, req)
        except DomainError as exc:
            return await self.show(request, status=HTTP_STATUS.get(exc.code, 500), error=str(exc))
        return see_other(f"/console/approvals/{row.approval_id}")

    async def _review(
        self, request: Request, row: store.Approval, text: str, note: str
    ) -> Response:
        """The edit as a diff against the exact arguments, with a form to confirm it."""
        try:
            edited = validate.json_value("arguments", text)
        except InvalidArgument as exc:
            return await self.show(request, status=400, error=str(exc))
        if not isinstance(edited, dict):
            return await self.show(request, status=400, error="arguments: must be a JSON object")
        return await self.show(request, edited=json.dumps(edited, sort_keys=True), note=note)
