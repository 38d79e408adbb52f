"""Summarisation requests for the model sandbox, and the prompts it records.

An executor whose run outgrew its context threshold asks for a recap with a
request whose last message is a user message opening with REQUEST_MARKER
(executor/context.py). A scenario answers it when it has a ``summary`` option::

    {"summary": {"content": "Recap {{nonce}}: ..."}, "record_prompts": true, "turns": [...]}

(``"summary": true`` gives a default text). ``{{nonce}}`` makes each recap
distinct, so one asked for again shows up as a different recap. The sandbox
appends ``[sandbox recap of N model turns]``: N is how many assistant turns the
recap stands for (those in the request, plus those of an earlier recap in it),
and later requests that carry the recap play the scenario's turn as if those N
assistant messages were still there.

With ``"record_prompts": true`` every request's log entry has ``prompt``: the
system message, the tool schemas, then the other messages, one JSON document
per line in the order received (most stable first), so a test can check that
each prompt extends the previous one byte for byte.
"""

import json
import random
import re
from typing import Any

from sandbox.scenario import Reply, Scenario, ScenarioError, render_turn

# The same text as executor/context.py REQUEST_MARKER (the sandbox imports no executor code).
REQUEST_MARKER = "[agentrun summary request]"
DEFAULT_RECAP = "Recap {{nonce}}: the earlier steps called tools and read their results."
_RECAPPED = re.compile(r"\[sandbox recap of (\d+) model turns\]")


def is_request(messages: list[dict[str, Any]]) -> bool:
    """Whether this chat request asks for a recap (its last message carries the marker)."""
    last = messages[-1] if messages else {}
    content = last.get("content")
    return (
        last.get("role") == "user"
        and isinstance(content, str)
        and content.startswith(REQUEST_MARKER)
    )


def turns_recapped(messages: list[dict[str, Any]]) -> int:
    """Assistant turns that recaps in the conversation stand for (the newest recap counts)."""
    found = [
        int(m.group(1))
        for message in messages
        if message.get("role") == "user" and isinstance(message.get("content"), str)
        for m in _RECAPPED.finditer(message["content"])
    ]
    return found[-1] if found else 0


def recap(scenario: Scenario, messages: list[dict[str, Any]], rng: random.Random) -> Reply:
    """The scenario's answer to a summarisation request; ScenarioError if it gives none."""
    option = scenario.summary
    if not option:
        raise ScenarioError(f"scenario {scenario.name!r} answers no summarisation request")
    turn = option if isinstance(option, dict) else {"content": DEFAULT_RECAP}
    text = render_turn({"content": turn.get("content", DEFAULT_RECAP)}, messages, rng).content
    covered = turns_recapped(messages) + sum(1 for m in messages if m.get("role") == "assistant")
    return Reply(content=f"{text}\n[sandbox recap of {covered} model turns]", tool_calls=())


def log_fields(scenario: Scenario, messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """What a request adds to its log entry: `"summary": true` when it asked for a recap,
    and its prompt when the scenario records prompts."""
    fields: dict[str, Any] = {"summary": True} if is_request(messages) else {}
    if scenario.record_prompts:
        fields["prompt"] = prompt_text(messages, tools)
    return fields


def prompt_text(messages: list[dict[str, Any]], tools: Any) -> str:
    """The prompt as one text, most stable first: system message, tools, other messages."""
    head = messages[:1] if messages and messages[0].get("role") == "system" else []
    parts = [*head, {"tools": tools or []}, *messages[len(head) :]]
    return "".join(json.dumps(part, ensure_ascii=False) + "\n" for part in parts)
