"""A real SMTP server (aiosmtpd) on a port of its own, keeping every message it accepts."""

from __future__ import annotations

import email
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from typing import Any

from aiosmtpd.controller import Controller


class Inbox:
    """aiosmtpd's handler: each DATA becomes a parsed message (envelope recipients kept)."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def smtp_server() -> Iterator[tuple[Controller, Inbox]]:
    """A plain-SMTP server (no TLS: a local relay) on 127.0.0.1, in its own thread."""
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    try:
        yield controller, inbox
    finally:
        controller.stop()
