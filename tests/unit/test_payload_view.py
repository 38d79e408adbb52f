"""The pure parts of large results: the truncated view, read_result arguments and slices,
and how replay shows both to the model (always the recorded text, never the payload)."""

from __future__ import annotations

import hashlib

from executor import payloads, transcript
from executor.payloads import Limits
from executor.replay import RESULT, Entry

LIMITS = Limits(threshold_bytes=100, view_bytes=10, read_max_bytes=50)
SHA = "ab" * 32


def test_the_view_shows_the_first_bytes_and_says_how_to_read_more():
    data = b"0123456789abcdef"
    text = payloads.view(data, SHA, LIMITS)
    assert text.startswith("0123456789\n[truncated: this result is 16 bytes")
    assert f'read_result(ref="{SHA}", offset=10, length=<at most 50>)' in text


def test_the_view_never_cuts_a_character_in_two():
    data = ("a" * 9 + "é" + "z" * 20).encode()  # é takes bytes 9 and 10
    text = payloads.view(data, SHA, LIMITS)
    assert text.startswith("a" * 9 + "\n")
    assert "offset=9," in text


def test_reference_names_the_bytes_by_their_hash():
    data = payloads.encode({"blob": "x" * 3})
    assert data == b'{"blob": "xxx"}'
    assert payloads.reference(data) == {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "media_type": "application/json",
    }


def _stored(seq: int, sha: str = SHA, untrusted: str | None = None) -> Entry:
    payload = {
        "call_id": "c",
        "tool": "blob",
        "status": "ok",
        "output": "VIEW",
        "payload": {"sha256": sha, "size": 99, "media_type": "application/json"},
    }
    if untrusted:
        payload["untrusted"] = untrusted
    return Entry(seq, RESULT, seq - 1, payload)


def test_a_ref_is_a_payload_sha_or_a_result_seq_of_this_run_only():
    entries = [_stored(3), Entry(5, RESULT, 4, {"tool": "echo", "status": "ok", "output": 1})]
    assert payloads.find(entries, SHA) == entries[0]
    assert payloads.find(entries, "3") == entries[0]
    assert payloads.find(entries, "5") is None  # a result kept inline has no payload
    assert payloads.find(entries, "cd" * 32) is None  # not referenced by this run


def test_read_arguments_are_checked_and_the_length_capped():
    assert payloads.read_arguments({"ref": SHA, "offset": 4, "length": 999}, 50) == (SHA, 4, 50)
    assert payloads.read_arguments({"ref": "7"}, 50) == ("7", 0, 50)
    assert "ref" in str(payloads.read_arguments({"ref": "nope"}, 50))
    assert "offset" in str(payloads.read_arguments({"ref": SHA, "offset": -1}, 50))
    assert "length" in str(payloads.read_arguments({"ref": SHA, "length": 0}, 50))


def test_a_slice_says_where_it_lies_in_the_whole():
    out = payloads.slice_output(SHA, 10, b"klmno", 20)
    assert out == {"ref": SHA, "offset": 10, "length": 5, "size": 20, "text": "klmno", "more": True}
    assert payloads.slice_output(SHA, 15, b"pqrst", 20)["more"] is False


def test_chunks_cover_the_payload_in_order():
    data = bytes(range(256)) * 10
    parts = payloads.chunks(data, 1000)
    assert [at for at, _ in parts] == [0, 1000, 2000]
    assert b"".join(part for _, part in parts) == data
    assert payloads.chunks(b"", 1000) == [(0, b"")]


def test_replay_shows_the_recorded_view_verbatim_and_the_recorded_slice():
    view_step = _stored(3)
    assert transcript.result_text(view_step.payload) == "VIEW"  # not re-quoted as JSON
    read = {
        "call_id": "r",
        "tool": "read_result",
        "status": "ok",
        "output": payloads.slice_output(SHA, 0, b"abc", 99),
    }
    text = transcript.result_text(read)
    assert '"text": "abc"' in text and '"offset": 0' in text


def test_a_view_of_untrusted_text_stays_delimited():
    step = _stored(3, untrusted="tool:read_thread")
    text = transcript.result_text(step.payload)
    assert "VIEW" in text and text != "VIEW"
