"""A tool call refused before it is committed or sent: the error whose message the model sees."""

from __future__ import annotations


class ToolCallRejected(Exception):
    """A tool call that must not be sent; the message is shown to the model."""
