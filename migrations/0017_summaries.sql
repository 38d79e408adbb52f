-- Summaries recorded as steps (issue 13): past its agent's context threshold a run's
-- executor asks the model for a recap of the older steps and commits it as a step of
-- its own kind, `summary`; later prompts read the recap in place of the span it covers
-- and replay never asks for it again (docs/protocol.md, "Context: summaries and a
-- stable prefix").
--
-- The threshold, context_tokens (estimated prompt tokens; 0 = off), is copied onto the
-- run at admission like every other limit (store/admission.py), so publishing a new
-- version never changes the prompts of a run under way.

ALTER TABLE steps DROP CONSTRAINT steps_kind_check;
ALTER TABLE steps ADD CONSTRAINT steps_kind_check CHECK (
    kind IN ('input', 'model_decision', 'tool_started', 'tool_result', 'park', 'finish',
             'approval_requested', 'approval_decided', 'summary'));

ALTER TABLE runs ADD COLUMN context_tokens integer NOT NULL DEFAULT 0
    CONSTRAINT run_context_tokens_not_negative CHECK (context_tokens >= 0);
