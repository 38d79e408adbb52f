"""Argument constraints, enforced in code before a tool call is committed as started.

The rules are data in the agent version (`AgentSpec.constraints`); the facts
they check come from the run's own log: the input step of a run a mail started
records that mail (`trigger.mail`: message and thread id, sender, recipients,
attachments). A pure function of (rules, call, trigger mail):

* `reply_to_trigger_thread`: every recipient is a participant of the triggering
  mail (its sender, To and Cc) and a `thread_id`, if given, is its thread; a
  run no mail started may not send at all.
* `attachments_from_trigger_thread`: every attachment named is the mail's.
* `recipient_known_or_approval`: a recipient neither on the thread nor known
  (`known_recipients`: addresses or `@domain`) needs a human's approval.
* `amount_at_most`: the amount is a number no larger than `max_amount`.
* `value_allowed`: the argument, read as its `value_kind` (an IBAN, mail
  addresses, a URL's host, a chat user or channel, an id), is in `allowed`
  (for addresses also: on the triggering thread; for ids: the triggering
  mail's attachments). A missing or malformed value fails closed. `action`
  HOLD asks a person instead of refusing.
* `untrusted_value`: a value of the arguments that appeared only in untrusted
  content (executor/provenance.py) holds the call for approval (default),
  refuses it, or is let through, as `action` says; the approval carries each
  value's origin step.

A refusal is an error result the model reads, naming the rule; nothing is sent.
These hold only together with least privilege: the attacker who sent the mail
is on its thread, so "reply to me with the customer list" passes the thread
rule, and what stops it is that the agent has no tool that reads such a list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import getaddresses
from typing import Any

from agentrun.v1 import agent_pb2, run_pb2
from executor import provenance

RECIPIENT_FIELDS = ("to", "cc", "bcc")


@dataclass(frozen=True)
class TriggerMail:
    """The mail that started the run, as its input step records it."""

    message_id: str
    thread_id: str
    participants: frozenset[str]
    attachments: frozenset[str]


@dataclass(frozen=True)
class Verdict:
    """What the rules say of one call: refused (why), held for approval (why), or fine."""

    refusal: str | None = None
    rule: str | None = None
    approval: str | None = None
    # Values that appeared only in untrusted content (untrusted_value rules).
    origins: tuple[provenance.Origin, ...] = ()

    @property
    def refused(self) -> bool:
        return self.refusal is not None


def rule_name(rule: int) -> str:
    """`reply_to_trigger_thread` for CONSTRAINT_RULE_REPLY_TO_TRIGGER_THREAD, and so on."""
    try:
        name = agent_pb2.ConstraintRule.Name(rule)  # type: ignore[arg-type]
    except ValueError:
        return f"rule_{rule}"
    return name.removeprefix("CONSTRAINT_RULE_").lower()


def addresses(value: Any) -> list[str]:
    """Mail addresses in an argument (a string, "A <a@x>, b@y", or a list of them), lowercased."""
    items = value if isinstance(value, list) else [value]
    texts = [str(v) for v in items if v is not None and str(v).strip()]
    return [addr.strip().lower() for _, addr in getaddresses(texts) if addr.strip()]


def trigger_mail(entries: Iterable[Any]) -> TriggerMail | None:
    """The triggering mail recorded in the run's input step, if a mail started the run."""
    for entry in entries:
        if entry.kind != run_pb2.STEP_KIND_INPUT:
            continue
        trigger = entry.payload.get("trigger")
        mail = trigger.get("mail") if isinstance(trigger, Mapping) else None
        if not isinstance(mail, Mapping):
            return None
        people = [
            *addresses(mail.get("from")),
            *addresses(mail.get("to")),
            *addresses(mail.get("cc")),
        ]
        return TriggerMail(
            message_id=str(mail.get("message_id") or ""),
            thread_id=str(mail.get("thread_id") or mail.get("message_id") or ""),
            participants=frozenset(people),
            attachments=frozenset(str(a) for a in mail.get("attachments") or []),
        )
    return None


def _recipients(c: agent_pb2.ToolConstraint, arguments: Mapping[str, Any]) -> list[str]:
    fields = [c.argument] if c.argument else list(RECIPIENT_FIELDS)
    return [addr for f in fields for addr in addresses(arguments.get(f))]


def _thread(c: agent_pb2.ToolConstraint, args: Mapping[str, Any], mail: TriggerMail | None) -> str:
    if mail is None:
        return "this run was not started by a mail, so it has no thread to reply to"
    for addr in _recipients(c, args):
        if addr not in mail.participants:
            return (
                f"{addr} is not on the triggering thread ({', '.join(sorted(mail.participants))})"
            )
    thread = args.get("thread_id")
    if thread is not None and str(thread) != mail.thread_id:
        return f"thread_id {str(thread)[:100]!r} is not the triggering thread {mail.thread_id!r}"
    return ""


def _attachment_ids(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [] if value is None else [value]
    out = []
    for item in items:
        if isinstance(item, Mapping):
            item = item.get("id") or item.get("attachment_id") or item.get("name") or ""
        out.append(str(item))
    return out


def _attachments(
    c: agent_pb2.ToolConstraint, args: Mapping[str, Any], mail: TriggerMail | None
) -> str:
    named = _attachment_ids(args.get(c.argument or "attachments"))
    allowed = mail.attachments if mail is not None else frozenset()
    foreign = [a for a in named if a not in allowed]
    if foreign:
        return f"attachment {foreign[0][:100]!r} is not one of the triggering thread's"
    return ""


def _known(who: str, known: Sequence[str], mail: TriggerMail | None) -> bool:
    if mail is not None and who in mail.participants:
        return True
    domain = "@" + who.rpartition("@")[2]
    return any(k.strip().lower() in (who, domain) for k in known)


def _recipient(
    c: agent_pb2.ToolConstraint, args: Mapping[str, Any], mail: TriggerMail | None
) -> str:
    unknown = [a for a in _recipients(c, args) if not _known(a, c.known_recipients, mail)]
    return f"{unknown[0]} is not a known recipient" if unknown else ""


def _amount(c: agent_pb2.ToolConstraint, args: Mapping[str, Any], mail: TriggerMail | None) -> str:
    name = c.argument or "amount"
    value = args.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} must be a number (at most {c.max_amount})"
    if value > c.max_amount:
        return f"{name} {value:g} is over the ceiling of {c.max_amount}"
    return ""


KINDS = {
    agent_pb2.VALUE_KIND_IBAN: "iban",
    agent_pb2.VALUE_KIND_EMAIL: "email",
    agent_pb2.VALUE_KIND_URL: "url",
    agent_pb2.VALUE_KIND_CHAT: "chat",
    agent_pb2.VALUE_KIND_ID: "id",
}
DEFAULT_ARGUMENT = {"iban": "iban", "email": "to", "url": "url", "chat": "channel", "id": "id"}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def _short(value: Any) -> str:
    return repr(str(value)[:100])


def _domain_ok(host: str, allowed: Sequence[str]) -> bool:
    return any(host == d or host.endswith("." + d) for d in allowed)


def _email_allowed(name: str, raw: Any, allowed: Sequence[str], mail: TriggerMail | None) -> str:
    found = addresses(raw)
    if not found:
        return f"{name} is missing: no address to check against the allowlist"
    for who in found:
        on_thread = mail is not None and who in mail.participants
        if not on_thread and who not in allowed and "@" + who.rpartition("@")[2] not in allowed:
            return f"{name} {who} is not an allowed recipient"
    return ""


def _iban_item(name: str, item: Any, allowed: Sequence[str], mail: TriggerMail | None) -> str:
    account = provenance.iban(item) if isinstance(item, str) else None
    if account is None:
        return f"{name} {_short(item)} is not a valid IBAN"
    return "" if account in allowed else f"{name} {account} is not an allowed payee"


def _url_item(name: str, item: Any, allowed: Sequence[str], mail: TriggerMail | None) -> str:
    host = provenance.host(item) if isinstance(item, str) else None
    if host is None:
        return f"{name} {_short(item)} is not an http(s) URL"
    if not _domain_ok(host, allowed):
        return f"{name} {_short(item)} is not on an allowed domain ({host})"
    return ""


def _chat_item(name: str, item: Any, allowed: Sequence[str], mail: TriggerMail | None) -> str:
    if str(item).strip().lower() in allowed:
        return ""
    return f"{name} {_short(item)} is not an allowed chat user or channel"


def _id_item(name: str, item: Any, allowed: Sequence[str], mail: TriggerMail | None) -> str:
    if (mail is not None and str(item) in mail.attachments) or str(item) in allowed:
        return ""
    return f"{name} {_short(item)} is not an allowed id"


ItemCheck = Callable[[str, Any, Sequence[str], "TriggerMail | None"], str]
_ITEM_CHECKS: dict[str, ItemCheck] = {
    "iban": _iban_item,
    "url": _url_item,
    "chat": _chat_item,
    "id": _id_item,
}


def normalise(kind: str, raw: str) -> str:
    """A value as allowlists hold it: an IBAN without spaces, upper case; a URL as its
    host; an id as it is; the rest lower case."""
    if kind == "iban":
        return provenance.iban(raw) or raw.replace(" ", "").upper()
    if kind == "url":
        return provenance.host(raw) or raw.strip().lower()
    if kind == "id":
        return raw
    return raw.strip().lower()


def _allowed(
    c: agent_pb2.ToolConstraint,
    args: Mapping[str, Any],
    mail: TriggerMail | None,
    seen: Mapping[tuple[str, str], Sequence[str]] | None = None,
) -> str:
    """Why the argument is not on the rule's allowlist ("" when it is); fails closed."""
    kind = KINDS.get(c.value_kind, "")
    name = c.argument or DEFAULT_ARGUMENT.get(kind, "")
    raw, allowed = args.get(name), list(c.allowed)
    if c.or_seen_before and seen:
        before = seen.get((c.tool, name), ())
        if kind == "email":
            allowed += [a for v in before for a in addresses(v)]
        else:
            allowed += [normalise(kind, str(v)) for v in before]
    if kind == "email":
        return _email_allowed(name, raw, allowed, mail)
    item_check = _ITEM_CHECKS.get(kind)
    if item_check is None:
        return f"the rule has no value kind to read {name} as"
    items = _items(raw)
    if not items or any(i is None or str(i).strip() == "" for i in items):
        return f"{name} is missing: nothing to check against the allowlist"
    return next((why for item in items if (why := item_check(name, item, allowed, mail))), "")


Check = Callable[[agent_pb2.ToolConstraint, Mapping[str, Any], TriggerMail | None], str]
_REFUSING: dict[str, Check] = {
    "reply_to_trigger_thread": _thread,
    "attachments_from_trigger_thread": _attachments,
    "amount_at_most": _amount,
}
_APPROVING: dict[str, Check] = {"recipient_known_or_approval": _recipient}


def _refused(name: str, tool: str, why: str) -> Verdict:
    return Verdict(
        refusal=f"refused by constraint {name} on {tool}: {why}; nothing was sent", rule=name
    )


def _untrusted(
    c: agent_pb2.ToolConstraint,
    tool: str,
    arguments: Mapping[str, Any],
    ledger: provenance.Ledger | None,
) -> Verdict | None:
    """An untrusted_value rule's verdict, or None: nothing marked (or ALLOW)."""
    if ledger is None:
        return None
    marked = tuple(ledger.marked(arguments, c.argument))
    if not marked or c.action == agent_pb2.CONSTRAINT_ACTION_ALLOW:
        return None
    first = marked[0]
    why = (
        f"{first.value.argument} {first.value.value} {first.summary}, not in the "
        "instructions, the input or a person's message"
    )
    if c.action == agent_pb2.CONSTRAINT_ACTION_REFUSE:
        refused = _refused("untrusted_value", tool, why)
        return Verdict(refusal=refused.refusal, rule=refused.rule, origins=marked)
    return Verdict(approval=f"untrusted_value: {why}", rule="untrusted_value", origins=marked)


def _valued(
    c: agent_pb2.ToolConstraint,
    name: str,
    tool: str,
    arguments: Mapping[str, Any],
    mail: TriggerMail | None,
    ledger: provenance.Ledger | None,
    seen: Mapping[tuple[str, str], Sequence[str]] | None,
) -> Verdict | None:
    """The verdict of a value_allowed or untrusted_value rule; None when it has nothing."""
    if name == "untrusted_value":
        return _untrusted(c, tool, arguments, ledger)
    why = _allowed(c, arguments, mail, seen)
    if not why:
        return None
    if c.action == agent_pb2.CONSTRAINT_ACTION_HOLD:
        return Verdict(approval=f"{name}: {why}", rule=name)
    return _refused(name, tool, why)


def check(
    rules: Iterable[agent_pb2.ToolConstraint],
    tool: str,
    arguments: Mapping[str, Any],
    mail: TriggerMail | None,
    ledger: provenance.Ledger | None = None,
    seen: Mapping[tuple[str, str], Sequence[str]] | None = None,
) -> Verdict:
    """The first refusal of the tool's rules; else the first reason to hold for approval.

    `ledger`: the run's trusted and untrusted text, for untrusted_value rules (without
    one they find nothing marked); `seen`: values the workspace's earlier ok calls sent,
    by (tool, argument), for value_allowed rules with or_seen_before."""
    approval = None
    for c in rules:
        if c.tool != tool:
            continue
        name = rule_name(c.rule)
        if name in ("value_allowed", "untrusted_value"):
            verdict = _valued(c, name, tool, arguments, mail, ledger, seen)
            if verdict is not None and verdict.refused:
                return verdict
            if verdict is not None and (approval is None or not approval.origins):
                approval = verdict
            continue
        if name in _REFUSING and (why := _REFUSING[name](c, arguments, mail)):
            return _refused(name, tool, why)
        if (
            name in _APPROVING
            and approval is None
            and (why := _APPROVING[name](c, arguments, mail))
        ):
            approval = Verdict(approval=f"{name}: {why}", rule=name)
        if name not in _REFUSING and name not in _APPROVING:
            return Verdict(refusal=f"refused: unknown constraint rule {name} on {tool}", rule=name)
    return approval or Verdict()
