"""The stream client's fixed choices: reconnect backoff and channel options."""

from __future__ import annotations

import random

from executor.stream import BACKOFF_CAP, CHANNEL_OPTIONS, backoff


def test_reconnect_backoff_starts_at_a_tenth_of_a_second_and_caps_at_two():
    random.seed(3)
    first = [backoff(0) for _ in range(50)]
    assert all(0.05 <= d <= 0.1 for d in first)
    assert all(0.1 <= backoff(1) <= 0.2 for _ in range(50))
    assert all(BACKOFF_CAP / 2 <= backoff(n) <= BACKOFF_CAP for n in range(5, 40))


def test_channel_accepts_large_assignments_and_keeps_alive():
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.max_receive_message_length"] == 64 * 1024 * 1024
    assert options["grpc.keepalive_time_ms"] > 0
