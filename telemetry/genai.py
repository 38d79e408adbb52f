"""Span names and attributes of the OpenTelemetry GenAI semantic conventions, for model
and tool calls, so agent-observability tools read our traces as they read any agent's.

The names are those of `opentelemetry-semantic-conventions` 0.66b2 (what the pinned SDK
brings; its `gen_ai_attributes` module): a model call is a CLIENT span `chat {model}` and a
tool call an INTERNAL span `execute_tool {tool}`. `gen_ai.provider.name` replaced
`gen_ai.system` in that version. tests/unit/test_genai_names.py checks these strings
against the package, so an upgrade that renames one fails there rather than in a trace
viewer. No prompt, completion or tool argument goes on a span: they may hold secrets.
"""

from __future__ import annotations

from typing import Any

OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CONVERSATION_ID = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"


def chat_span_name(model: str) -> str:
    return f"{CHAT} {model}" if model else CHAT


def chat_request(provider: str, model: str, run_id: str) -> dict[str, Any]:
    """A model call's attributes known before it is sent (the run is the conversation)."""
    return {
        OPERATION_NAME: CHAT,
        PROVIDER_NAME: provider,
        REQUEST_MODEL: model,
        CONVERSATION_ID: run_id,
    }


def chat_response(
    model: str, response_id: str, input_tokens: int, output_tokens: int, finish_reason: str
) -> dict[str, Any]:
    """A model call's attributes from its reply; the token counts are those its step records."""
    found: dict[str, Any] = {USAGE_INPUT_TOKENS: input_tokens, USAGE_OUTPUT_TOKENS: output_tokens}
    if model:
        found[RESPONSE_MODEL] = model
    if response_id:
        found[RESPONSE_ID] = response_id
    if finish_reason:
        found[RESPONSE_FINISH_REASONS] = [finish_reason]
    return found


def tool_span_name(tool: str) -> str:
    return f"{EXECUTE_TOOL} {tool}"


def tool_call(tool: str, call_id: str, run_id: str) -> dict[str, Any]:
    """A tool call's attributes. Our tools run on the agent's side and call out to APIs:
    the conventions' `extension` type."""
    return {
        OPERATION_NAME: EXECUTE_TOOL,
        TOOL_NAME: tool,
        TOOL_CALL_ID: call_id,
        TOOL_TYPE: "extension",
        CONVERSATION_ID: run_id,
    }
