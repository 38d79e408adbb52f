"""The named-query loader."""

from __future__ import annotations

import asyncpg
import pytest

from control_plane.store import queries
from control_plane.store.queries import refusal


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


def load(tmp_path, text: str) -> dict[str, queries.Query]:
    (tmp_path / "q.sql").write_text(text)
    return queries.load_all(tmp_path)


def test_named_parameters_are_numbered_in_order_of_first_use(tmp_path):
    q = load(tmp_path, "-- name: q :one\n-- uses :b in a comment\nSELECT :a::int, :b, :a;\n")["q"]
    assert q.params == ("a", "b")
    assert q.sql.splitlines()[1] == "SELECT $1::int, $2, $1"
    # The comment keeps its words: a parameter named there is no parameter.
    assert q.sql.splitlines()[0] == "-- uses :b in a comment"


def test_a_call_must_name_exactly_the_parameters(tmp_path):
    q = load(tmp_path, "-- name: q :one\n-- d\nSELECT :run_id, :epoch;\n")["q"]
    assert queries.arguments(q, (), {"epoch": 3, "run_id": "r"}) == ("r", 3)
    with pytest.raises(TypeError, match=r"missing \['epoch'\], unknown \['epoc'\]"):
        queries.arguments(q, (), {"run_id": "r", "epoc": 3})
    with pytest.raises(TypeError, match="by name"):
        queries.arguments(q, ("r", 3), {})


def test_positional_queries_refuse_names_and_mixing_is_refused(tmp_path):
    q = load(tmp_path, "-- name: q :one\n-- d\nSELECT $1;\n")["q"]
    with pytest.raises(TypeError, match="positional"):
        queries.arguments(q, (), {"a": 1})
    with pytest.raises(ValueError, match=r"mixes \$n and :name"):
        load(tmp_path, "-- name: q :one\n-- d\nSELECT $1, :a;\n")


def test_fragments_are_included_and_never_run_alone(tmp_path):
    found = load(
        tmp_path,
        "-- name: shared :fragment\n-- what it does\nx AS (SELECT :a AS v)\n\n"
        "-- name: q :one\n-- d\nWITH {{shared}}\nSELECT v, :b FROM x;\n",
    )
    assert set(found) == {"q"}
    assert found["q"].params == ("a", "b")
    assert "WITH x AS (SELECT $1 AS v)" in found["q"].sql
    with pytest.raises(ValueError, match="unknown fragment nope"):
        load(tmp_path, "-- name: q :one\n-- d\nWITH {{nope}} SELECT 1;\n")


def test_every_admission_includes_the_one_run_admit_shape():
    """StartRun (of a version named or of the latest one as cached), trigger events,
    session turns, child runs, forks and flushed debounces and batches insert runs by one
    SQL shape."""
    inserting = {n for n, q in queries.QUERIES.items() if "INSERT INTO runs" in q.sql}
    assert inserting == {
        "run_insert",
        "run_insert_latest",
        "trigger_event_admit",
        "session_turn_admit",
        "child_admit",
        "fork_admit",
        "flow_consume",
    }
    for name in inserting:
        assert queries.QUERIES[name].sql.count("INSERT INTO runs") == 1
        assert "admitted_input AS" in queries.QUERIES[name].sql


def test_every_statement_that_writes_steps_counts_them():
    """runs.step_count counts what the log holds: whoever inserts a step bumps it in the
    same statement (no trigger re-updates the run row on the commit path)."""
    writers = {q.name: q.sql for q in queries.QUERIES.values() if "INSERT INTO steps" in q.sql}
    assert {"run_commit", "run_cancel", "approval_decision_step"} <= set(writers)
    uncounted = sorted(name for name, sql in writers.items() if "step_count" not in sql)
    assert uncounted == []


def test_a_value_asyncpg_refuses_is_described_without_the_value() -> None:
    """A DataRefused's message may reach the caller: asyncpg quotes the value, which may be
    anything the statement carries; the server quotes at most the caller's own text."""
    quoted = asyncpg.exceptions.DataError(
        "invalid input for query argument $3: 'sk_live_secret' (expected str, got bytes)"
    )
    assert refusal(quoted) == "invalid input for query argument $3 (expected str, got bytes)"
    assert refusal(asyncpg.exceptions.DataError("odd 'sk_live_secret'")) == (
        "a value of the wrong type"
    )
    server = asyncpg.exceptions.CharacterNotInRepertoireError(
        'invalid byte sequence for encoding "UTF8": 0x00'
    )
    server.severity = "ERROR"  # as the server's errors carry it
    assert refusal(server) == 'invalid byte sequence for encoding "UTF8": 0x00'
