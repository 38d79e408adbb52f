"""The named-query loader."""

from __future__ import annotations

import pytest

from control_plane.store import queries


def test_parse_splits_named_queries_with_their_modes():
    text = "-- name: a :one\n-- first\nSELECT 1;\n\n-- name: b :exec\n-- second\nDELETE FROM t;\n"
    parsed = queries.parse(text, "x.sql")
    assert {n: q.mode for n, q in parsed.items()} == {"a": "one", "b": "exec"}
    assert parsed["a"].sql.endswith("SELECT 1")


def test_a_file_without_headers_is_refused():
    with pytest.raises(ValueError, match="no '-- name:' headers"):
        queries.parse("SELECT 1;", "bad.sql")


def test_duplicate_names_across_files_are_refused(tmp_path):
    (tmp_path / "a.sql").write_text("-- name: q :one\nSELECT 1;\n")
    (tmp_path / "b.sql").write_text("-- name: q :one\nSELECT 2;\n")
    with pytest.raises(ValueError, match="defined in a.sql and b.sql"):
        queries.load_all(tmp_path)


def test_every_shipped_query_has_a_description_line():
    for q in queries.QUERIES.values():
        first = q.sql.splitlines()[0]
        assert first.startswith("-- "), f"{q.name} lacks a description line"
