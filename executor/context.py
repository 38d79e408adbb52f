"""The prompt the model reads: most stable first, and recaps in place of old steps.

A stable prefix. A prompt is the agent's instructions (the system message), its
tool schemas, then the run's steps as messages in seq order (transcript.build_messages).
Each part is a pure function of the agent version and the recorded steps: tool
schemas and call arguments serialised with sorted keys, tool results as recorded
(a payload's truncated view verbatim), no clock and no per-request id anywhere.
So each model call's prompt extends the previous one byte for byte, and a
provider's prompt cache hits, until a summary replaces a span.

Summaries. The run's `context_tokens` (RunLimits, copied at admission; 0 = off)
bounds the prompt's size, estimated by `estimate_tokens`: the characters of the
tool schemas and messages as compact JSON, divided by 4 and rounded up. The
estimate needs no tokenizer and is the same on every executor and on replay.
Before a model call whose prompt would be over it, `plan` picks the span to recap:
every turn (a decision with the tool steps that answer it) since the last recap,
except the newest, kept verbatim — as many as fit in half the threshold, at
least one. Whole turns only, so every assistant tool call keeps its tool results
and the chat stays valid. The executor asks the model for the recap with
`request_messages` (the prompt up to the span's end — a prefix of the current
prompt, so it too reads from the provider's cache — and one user message opening
with REQUEST_MARKER) and commits the answer as a `summary` step (`payload`).
Later prompts carry the recap in place of the steps from_seq..through_seq; the
next summary recaps the earlier recap together with the turns after it, and
replaces it. Replay reads the recorded recap: nothing asks for it again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from executor import replay, transcript
from executor.approval import canonical_json
from executor.models.base import ModelReply
from executor.replay import Entry

CHARS_PER_TOKEN = 4
# Opens the last message of a summarisation request (the sandbox model knows it by it).
REQUEST_MARKER = "[agentrun summary request]"
REQUEST_TEXT = (
    f"{REQUEST_MARKER} The conversation is getting long. Write a recap of everything "
    "above: the task, what was done (tools called and what they returned, the facts "
    "and numbers that matter), what was decided and what is still to do. It replaces "
    "these messages in later prompts, so keep every detail needed to go on; be brief "
    "otherwise. Answer with the recap text only; call no tool."
)


@dataclass(frozen=True)
class Span:
    """The steps a recap is asked for: seqs from_seq..through_seq (an earlier recap's
    included), `turns` decisions in all; `prompt_tokens`: the estimate that asked."""

    from_seq: int
    through_seq: int
    turns: int
    prompt_tokens: int


def stable_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tool schemas with every object's keys sorted: the same bytes on every call."""
    return list(json.loads(canonical_json(list(tools))))


def estimate_tokens(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] = (),
    rendered: transcript.RenderedTurns | None = None,
) -> int:
    """The prompt's size in tokens, estimated: characters of compact JSON / 4, rounded up.
    A list's compact JSON is its items' joined by commas in brackets, so the length adds up
    message by message; with `rendered` (the run's), a kept turn's are measured once."""
    chars = rendered.chars if rendered is not None else _chars
    items = sum(chars(m) for m in messages) + max(len(messages) - 1, 0)
    size = len(canonical_json(list(tools))) + 2 + items
    return -(-size // CHARS_PER_TOKEN)


def _chars(message: Mapping[str, Any]) -> int:
    return len(canonical_json(message))


def plan(
    entries: list[Entry],
    instructions: str,
    tools: Sequence[Any],
    threshold: int,
    rendered: transcript.RenderedTurns | None = None,
) -> Span | None:
    """The span to recap before the next model call, or None: no threshold, the prompt
    fits, or nothing but the newest turn is left to recap. `rendered`: the run's turns as
    rendered before (transcript.RenderedTurns)."""
    if threshold <= 0:
        return None
    messages = transcript.build_messages(entries, instructions, rendered)
    size = estimate_tokens(messages, tools, rendered)
    if size <= threshold:
        return None
    prior = transcript.latest_summary(entries)
    done = int(prior.payload["through_seq"]) if prior else -1
    open_turns = [t for t in replay.decision_turns(entries) if t.decision.seq > done]
    kept = _newest_within(open_turns, threshold // 2)
    recapped = len(open_turns) - kept
    if recapped <= 0:
        return None
    start = int(prior.payload["from_seq"]) if prior else open_turns[0].decision.seq
    earlier = int(prior.payload.get("turns", 0)) if prior else 0
    through = open_turns[recapped].decision.seq - 1
    return Span(start, through, earlier + recapped, size)


def _newest_within(turns: Sequence[Any], budget: int) -> int:
    """How many of the newest turns fit in `budget` estimated tokens (at least one)."""
    kept, used = 0, 0
    for turn in reversed(turns):
        used += estimate_tokens(transcript.turn_messages(turn))
        if kept and used > budget:
            break
        kept += 1
    return kept


def request_messages(entries: list[Entry], instructions: str, span: Span) -> list[dict[str, Any]]:
    """The summarisation request: the prompt up to the span's end, then the ask."""
    upto = [e for e in entries if e.seq <= span.through_seq or e.kind == replay.SUMMARY]
    return [
        *transcript.build_messages(upto, instructions),
        {"role": "user", "content": REQUEST_TEXT},
    ]


def recap_text(reply: ModelReply) -> str:
    """The recap a reply carries ("" when the model wrote none)."""
    return (reply.content or "").strip()


def payload(span: Span, reply: ModelReply, model: str) -> dict[str, Any]:
    """The `summary` step's payload (docs/protocol.md)."""
    return {
        "text": recap_text(reply),
        "from_seq": span.from_seq,
        "through_seq": span.through_seq,
        "turns": span.turns,
        "prompt_tokens_estimated": span.prompt_tokens,
        "usage": reply.usage.to_payload(),
        "model": reply.model or model,
        "response_id": reply.response_id,
    } | ({} if reply.duration_ms is None else {"duration_ms": reply.duration_ms})
