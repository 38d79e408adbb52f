"""executor/storable.py: outside text and JSON as the control plane can keep them."""

from __future__ import annotations

import json
import math

from control_plane.api import validate
from executor import storable
from executor.replay import RESULT
from executor.steps import as_entry, new_step

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
    assert validate.json_value("payload_json", text) == {
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
    validate.json_value("payload_json", step.payload_json)
    entry = as_entry(step)
    assert entry.payload["output"]["text"] == "a\ufffdb"
    assert entry.payload["output"]["nan"] == "NaN"
