"""executor/storable.py: outside text and JSON as the control plane can keep them."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from executor import storable
from executor.replay import RESULT
from executor.steps import as_entry, new_step
from tests.harness.invariants import stored_payload

HOSTILE = {
    "text": "a\x00b",
    "lone": "half an emoji \ud83d here",
    "pair": "😀 é \u2028",
    "nan": math.nan,
    "big": [math.inf, -math.inf, 1.5, 10**30],
    "nested": {"k\x00": ["\udfff", {"deep": "\x00"}]},
    "literal": "\\u0000 is six characters",
}


def test_text_replaces_nul_and_lone_surrogates_and_keeps_the_rest() -> None:
    assert storable.text("a\x00b\ud800c") == "a\ufffdb\ufffdc"
    assert storable.text("😀 é \u2028") == "😀 é \u2028"
    clean = "plain ascii"
    assert storable.text(clean) is clean


def test_json_text_of_ordinary_data_is_json_dumps_compact() -> None:
    data = {"content": "hé 😀", "tool_calls": [{"id": "c1", "arguments": {"n": 1.5}}], "x": None}
    assert storable.json_text(data) == json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def test_json_text_keeps_what_postgres_and_protobuf_cannot_as_text() -> None:
    text = storable.json_text(HOSTILE)
    text.encode("utf-8")  # no lone surrogate left
    assert stored_payload(text) == {
        "text": "a\ufffdb",
        "lone": "half an emoji \ufffd here",
        "pair": "😀 é \u2028",
        "nan": "NaN",
        "big": ["Infinity", "-Infinity", 1.5, 10**30],
        "nested": {"k\ufffd": ["\ufffd", {"deep": "\ufffd"}]},
        "literal": "\\u0000 is six characters",
    }


def test_a_step_of_hostile_output_is_built_and_replays_as_committed() -> None:
    step = new_step(4, RESULT, {"call_id": "c1", "output": HOSTILE}, ref_seq=3)
    stored_payload(step.payload_json)
    entry = as_entry(step)
    assert entry.payload["output"]["text"] == "a\ufffdb"
    assert entry.payload["output"]["nan"] == "NaN"


def _nested(levels: int) -> Any:
    data: Any = "bottom"
    for _ in range(levels):
        data = {"down": [data]}
    return data


def _below(node: Any) -> Any:
    """The one array or object (or the string at the bottom) inside `node`."""
    return node[0] if isinstance(node, list) else node.get("output", node.get("down"))


def test_what_nests_past_the_limit_is_kept_as_its_json_text() -> None:
    payload = {"call_id": "c1", "output": _nested(300)}  # 601 levels in all
    kept = stored_payload(storable.json_text(payload))
    containers, node, original = 0, kept, payload
    while isinstance(node, (dict, list)):
        containers, node, original = containers + 1, _below(node), _below(original)
    assert containers == storable.MAX_DEPTH  # as deep as a step may nest, then its JSON text
    assert isinstance(node, str) and json.loads(node) == original


def test_parse_refuses_json_nested_past_pythons_reader_as_not_json() -> None:
    with pytest.raises(ValueError):
        storable.parse("[" * 100_000 + "]" * 100_000)
    assert storable.parse(b'{"a": [1, NaN]}')["a"][0] == 1
