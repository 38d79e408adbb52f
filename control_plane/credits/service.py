"""CreditService: grants (platform admins), a workspace's balance and its ledger."""

from __future__ import annotations

import grpc

from agentrun.v1 import credit_pb2 as pb
from agentrun.v1 import credit_pb2_grpc
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.ground import convert, validate
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.store import credits as store
from control_plane.store import workspaces
from control_plane.store.db import Pool, transaction

POLICY_TO_PROTO = {"park": pb.OUT_OF_CREDITS_PARK, "fail": pb.OUT_OF_CREDITS_FAIL}
POLICY_FROM_PROTO = {v: k for k, v in POLICY_TO_PROTO.items()}
KIND_TO_PROTO = {
    "grant": pb.CREDIT_LEDGER_ENTRY_KIND_GRANT,
    "reserve": pb.CREDIT_LEDGER_ENTRY_KIND_RESERVE,
    "spend": pb.CREDIT_LEDGER_ENTRY_KIND_SPEND,
    "release": pb.CREDIT_LEDGER_ENTRY_KIND_RELEASE,
}
# A grant adds at most a million credits at a time (a typo's zeros stay a typo).
MAX_GRANT_MICROS = 10**12


def balance(workspace_id: str, account: store.Account | None) -> pb.CreditBalance:
    if account is None:
        return pb.CreditBalance(workspace_id=workspace_id, metered=False)
    return pb.CreditBalance(
        workspace_id=workspace_id,
        metered=True,
        granted_micros=account.granted_micros,
        balance_micros=account.balance_micros,
        reserved_micros=account.reserved_micros,
        spent_micros=account.spent_micros,
        chunk_micros=account.chunk_micros,
        out_of_credits=POLICY_TO_PROTO[account.out_of_credits],
        update_time=convert.timestamp(account.updated_at),
    )


def entry(e: store.Entry) -> pb.CreditLedgerEntry:
    return pb.CreditLedgerEntry(
        entry_id=e.entry_id,
        kind=KIND_TO_PROTO[e.kind],
        run_id=str(e.run_id or ""),
        chunk=e.chunk,
        amount_micros=e.amount_micros,
        granted_by=e.granted_by or "",
        note=e.note,
        create_time=convert.timestamp(e.created_at),
    )


def _policy(value: int) -> str | None:
    if value == pb.OUT_OF_CREDITS_UNSPECIFIED:
        return None
    if value not in POLICY_FROM_PROTO:
        raise InvalidArgument("out_of_credits", f"unknown policy {value}")
    return POLICY_FROM_PROTO[value]


def _page_token(value: str) -> int | None:
    if not value:
        return None
    if not value.isdigit() or len(value) > 19:
        raise InvalidArgument("page_token", "is not a token this service gave")
    return int(value)


class CreditServicer(credit_pb2_grpc.CreditServiceServicer):
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def GrantCredits(
        self, request: pb.GrantCreditsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GrantCreditsResponse:
        ws = validate.slug("workspace_id", request.workspace_id)
        amount = validate.in_range("amount_micros", request.amount_micros, 1, MAX_GRANT_MICROS)
        chunk = validate.in_range("chunk_micros", request.chunk_micros, 0, MAX_GRANT_MICROS)
        policy = _policy(request.out_of_credits)
        note = validate.text("note", request.note, max_bytes=1000)
        who = auth_context.current()
        async with transaction(self._pool) as conn:
            if await workspaces.get(conn, ws) is None:
                raise NotFound(f"workspace {ws!r} not found")
            account = await store.grant(
                conn,
                ws,
                amount,
                who.label,
                note=note,
                chunk_micros=chunk or None,
                out_of_credits=policy,
            )
            await audit.record(
                conn,
                "credits.granted",
                "workspace",
                ws,
                {
                    "amount_micros": amount,
                    "chunk_micros": account.chunk_micros,
                    "out_of_credits": account.out_of_credits,
                },
                workspace_id=ws,
            )
        return pb.GrantCreditsResponse(balance=balance(ws, account))

    async def GetCreditBalance(
        self, request: pb.GetCreditBalanceRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetCreditBalanceResponse:
        ws = auth_context.workspace(request.workspace_id)
        return pb.GetCreditBalanceResponse(balance=balance(ws, await store.account(self._pool, ws)))

    async def ListCreditLedger(
        self, request: pb.ListCreditLedgerRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListCreditLedgerResponse:
        ws = auth_context.workspace(request.workspace_id)
        size = validate.in_range("page_size", request.page_size or 100, 1, 1000)
        before = _page_token(request.page_token)
        run_id = validate.run_id("run_id", request.run_id) if request.run_id else None
        rows = await store.ledger_page(self._pool, ws, before, size, run_id)
        token = str(rows[-1].entry_id) if len(rows) == size else ""
        return pb.ListCreditLedgerResponse(entries=[entry(e) for e in rows], next_page_token=token)
