"""The bounded JSON parser and the NUL walk, on their own (no server)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import struct_pb2

from agentrun.v1 import approval_pb2, executor_pb2
from control_plane.ground import validate
from control_plane.ground.decoding import Refused, guard_decoder, nul_path
from control_plane.ground.errors import MAX_DETAILS, InvalidArgument, status_for
from control_plane.store.errors import DataRefused


def refusal(text: str | bytes, **limits: int) -> str:
    with pytest.raises(InvalidArgument) as info:
        validate.json_value("f", text, **limits)
    return str(info.value)


def test_depth_is_counted_outside_strings_only() -> None:
    at_limit = "[" * 64 + "]" * 64
    assert validate.json_value("f", at_limit) is not None
    assert refusal("[" + at_limit + "]") == "f: is nested deeper than 64 levels"
    brackets_in_strings = '{"a": "' + "[" * 500 + '", "b": "\\"{{{{"}'
    assert validate.json_value("f", brackets_in_strings)["a"] == "[" * 500
    many_but_flat = "[" + ",".join(["[1]"] * 1000) + "]"
    assert len(validate.json_value("f", many_but_flat)) == 1000


def test_deep_bodies_never_reach_the_recursive_parser() -> None:
    for text in (
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 40_000 + "1" + "}" * 40_000,
        "[" * 100_000,
    ):
        assert refusal(text) == "f: is nested deeper than 64 levels"


def test_nul_escapes_nan_size_and_encoding_are_refused() -> None:
    assert refusal('{"a": "x\\u0000"}') == "f: contains a NUL character"
    assert refusal('["\\\\\\u0000"]') == "f: contains a NUL character"  # backslash, then NUL
    assert validate.json_value("f", '["\\\\u0000"]') == ["\\u0000"]  # an escaped backslash
    assert refusal('{"a": NaN}') == "f: is not valid JSON"
    assert refusal("[Infinity]") == "f: is not valid JSON"
    assert refusal("[1,") == "f: is not valid JSON"
    assert refusal("[1]", max_bytes=2) == "f: is 3 bytes; the limit is 2"
    assert refusal(b"\xff") == "f: is not UTF-8"
    assert validate.json_text("f", "[[1]]", max_depth=2) == "[[1]]"


def test_the_nul_walk_names_nested_repeated_and_map_fields() -> None:
    edit = approval_pb2.DecideApprovalRequest(edit=approval_pb2.Edit(note="a\x00"))
    assert nul_path(edit) == "edit.note"
    commit = executor_pb2.Commit(
        steps=[executor_pb2.NewStep(), executor_pb2.NewStep(payload_json="\x00")]
    )
    assert nul_path(commit) == "steps[1].payload_json"
    doc = struct_pb2.Struct()
    doc.update({"ok": "fine", "inner": {"deep": ["x", "y\x00"]}})
    assert (
        nul_path(doc)
        == "fields['inner'].struct_value.fields['deep'].list_value.values[1].string_value"
    )
    assert nul_path(executor_pb2.ConnectRequest(commit=commit), skip={"commit"}) is None
    assert nul_path(approval_pb2.DecideApprovalRequest(approver="alice")) is None


def test_a_refusal_never_quotes_a_huge_key_or_input() -> None:
    """A status message travels as a trailer; clients refuse one over 16 KiB, and the call
    then fails as a transport error instead of INVALID_ARGUMENT (the fuzz test found it)."""
    doc = struct_pb2.Struct()
    doc.update({"k" * 300_000: "\x00"})
    path = nul_path(doc)
    assert path is not None and path.startswith("fields['kkk") and len(path) < 100
    code, message = status_for(InvalidArgument("field", "x" * 300_000))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and len(message) <= MAX_DETAILS + 10


def test_a_value_postgres_refused_is_the_callers_error_not_an_internal_one() -> None:
    """A NUL or an out-of-range number no check caught before the database (DataRefused) is
    INVALID_ARGUMENT (HTTP 400) naming the statement and what was wrong, never INTERNAL."""
    refused = DataRefused('console_run_search: invalid byte sequence for encoding "UTF8": 0x00')
    code, message = status_for(refused)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("console_run_search:") and "0x00" in message


def test_text_with_a_nul_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument, match="^q: must not contain a NUL character$"):
        validate.text("q", "a\x00b", max_bytes=200)
    assert validate.text("q", "été", max_bytes=200) == "été"


def test_the_guarded_decoder_never_raises() -> None:
    decode = guard_decoder(approval_pb2.DecideApprovalRequest.FromString)
    assert decode is not None
    good = approval_pb2.DecideApprovalRequest(approver="alice")
    assert decode(good.SerializeToString()) == good
    bad = decode(b"\x0a\x01\xff")
    assert (
        isinstance(bad, Refused) and bad.problem == "request is not a valid DecideApprovalRequest"
    )
    nul = decode(approval_pb2.DecideApprovalRequest(approver="a\x00").SerializeToString())
    assert isinstance(nul, Refused) and nul.problem == "approver: contains a NUL character"
