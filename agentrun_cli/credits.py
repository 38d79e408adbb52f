"""`agentrun credits balance|grant|ledger`: a workspace's credits from the shell.

    agentrun credits grant 25 --chunk 0.5 --when-out fail   # a platform admin key; credits
    agentrun credits balance
    agentrun credits ledger --limit 20 --run RUN

Amounts are in credits (1 credit = 1,000,000 micro-credits, what the API counts in); a
workspace never granted any is unlimited. Each run's own spend is on `agentrun runs show`.
"""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation
from typing import Any

from agentrun.v1 import credit_pb2 as pb
from agentrun.v1 import credit_pb2_grpc
from agentrun_cli import argtypes, credentials, render

TIMEOUT = 30.0
MICROS = Decimal(1_000_000)
POLICIES = {"park": pb.OUT_OF_CREDITS_PARK, "fail": pb.OUT_OF_CREDITS_FAIL}


def credits_amount(text: str) -> int:
    """`2.5` credits as micro-credits (argparse type): exact, no float."""
    try:
        micros = Decimal(text) * MICROS
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of credits") from None
    if not micros.is_finite():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number of credits")
    if micros != micros.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r}: finer than a micro-credit")
    low, high = argtypes.INT64
    if not low <= micros <= high:  # the request's int64 micro-credits
        raise argparse.ArgumentTypeError(f"{text!r}: too many credits (at most {high // 10**6:,})")
    return int(micros)


def shown(micros: int) -> str:
    """Micro-credits as credits, exactly (`1.25`, `-0.000300`)."""
    return f"{Decimal(micros) / MICROS:f}"


def _call(args: argparse.Namespace, method: str, request: Any, role: str = "reader") -> Any:
    channel = credentials.channel(args.address, credentials.api_key(role))
    with channel:
        return getattr(credit_pb2_grpc.CreditServiceStub(channel), method)(request, timeout=TIMEOUT)


def balance_lines(b: pb.CreditBalance) -> list[str]:
    if not b.metered:
        return [f"workspace {b.workspace_id}: unlimited (no credit account)"]
    policy = pb.OutOfCredits.Name(b.out_of_credits).removeprefix("OUT_OF_CREDITS_").lower()
    rows = [
        ("workspace", b.workspace_id),
        ("balance", shown(b.balance_micros)),
        ("reserved", f"{shown(b.reserved_micros)} (held by live runs)"),
        ("spent", shown(b.spent_micros)),
        ("granted", shown(b.granted_micros)),
        ("chunk", f"{shown(b.chunk_micros)} per reservation; when out: {policy}"),
    ]
    return [f"{name:<9} {value}" for name, value in rows]


def entry_line(e: pb.CreditLedgerEntry) -> str:
    kind = pb.CreditLedgerEntryKind.Name(e.kind).removeprefix("CREDIT_LEDGER_ENTRY_KIND_").lower()
    what = f"run {e.run_id}" + (f" chunk {e.chunk}" if e.chunk else "") if e.run_id else ""
    who = f"by {e.granted_by}" if e.granted_by else ""
    note = f"({e.note})" if e.note else ""
    when = render.timestamp(e.create_time)
    return " ".join(
        filter(
            None,
            [
                f"{e.entry_id:>8}",
                when,
                f"{kind:<8}",
                f"{shown(e.amount_micros):>14}",
                what,
                who,
                note,
            ],
        )
    )


def _emit(args: argparse.Namespace, value: Any, lines: list[str]) -> None:
    print(render.to_json(value, indent=2) if args.json else "\n".join(lines))


def credits_balance(args: argparse.Namespace) -> int:
    b = _call(args, "GetCreditBalance", pb.GetCreditBalanceRequest(workspace_id=args.workspace))
    _emit(args, b.balance, balance_lines(b.balance))
    return 0


def credits_grant(args: argparse.Namespace) -> int:
    req = pb.GrantCreditsRequest(
        workspace_id=args.workspace,
        amount_micros=args.amount,
        chunk_micros=args.chunk or 0,
        out_of_credits=POLICIES.get(args.when_out or "", pb.OUT_OF_CREDITS_UNSPECIFIED),
        note=args.note,
    )
    b = _call(args, "GrantCredits", req, role="platform").balance
    _emit(args, b, balance_lines(b))
    return 0


def credits_ledger(args: argparse.Namespace) -> int:
    req = pb.ListCreditLedgerRequest(
        workspace_id=args.workspace, page_size=args.limit, run_id=args.run or ""
    )
    entries = list(_call(args, "ListCreditLedger", req).entries)
    _emit(args, entries, [entry_line(e) for e in entries] or ["(no entries)"])
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser("credits", help="the workspace's credits").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = actions.add_parser("balance", help="balance, reserved, spent", parents=[common])
    p.set_defaults(handler=credits_balance)
    p = actions.add_parser("grant", help="add credits (a platform admin)", parents=[common])
    p.add_argument("amount", type=credits_amount, help="credits to add, e.g. 25 or 0.5")
    p.add_argument("--chunk", type=credits_amount, help="credits a run reserves at a time")
    p.add_argument("--when-out", choices=sorted(POLICIES), help="runs park (default) or fail")
    p.add_argument("--note", default="", help="recorded with the grant")
    p.set_defaults(handler=credits_grant)
    p = actions.add_parser("ledger", help="the ledger, newest first", parents=[common])
    p.add_argument("--limit", type=argtypes.int32, default=50, metavar="N", help="default 50")
    p.add_argument("--run", metavar="RUN", help="only this run's entries")
    p.set_defaults(handler=credits_ledger)
