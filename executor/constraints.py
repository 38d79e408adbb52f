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


Check = Callable[[agent_pb2.ToolConstraint, Mapping[str, Any], TriggerMail | None], str]
_REFUSING: dict[str, Check] = {
    "reply_to_trigger_thread": _thread,
    "attachments_from_trigger_thread": _attachments,
    "amount_at_most": _amount,
}
_APPROVING: dict[str, Check] = {"recipient_known_or_approval": _recipient}


def check(
    rules: Iterable[agent_pb2.ToolConstraint],
    tool: str,
    arguments: Mapping[str, Any],
    mail: TriggerMail | None,
) -> Verdict:
    """The first refusal of the tool's rules; else the first reason to hold for approval."""
    approval = None
    for c in rules:
        if c.tool != tool:
            continue
        name = rule_name(c.rule)
        if name in _REFUSING and (why := _REFUSING[name](c, arguments, mail)):
            text = f"refused by constraint {name} on {tool}: {why}; nothing was sent"
            return Verdict(refusal=text, rule=name)
        if (
            name in _APPROVING
            and approval is None
            and (why := _APPROVING[name](c, arguments, mail))
        ):
            approval = Verdict(approval=f"{name}: {why}", rule=name)
        if name not in _REFUSING and name not in _APPROVING:
            return Verdict(refusal=f"refused: unknown constraint rule {name} on {tool}", rule=name)
    return approval or Verdict()
