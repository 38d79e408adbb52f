"""Loads the named SQL queries in sql/*.sql and runs them through asyncpg.

Each query opens with `-- name: <name> :one|:many|:exec` and a description
line (River and procrastinate keep their SQL the same way). `:one` maps to
fetchrow, `:many` to fetch, `:exec` to execute.

A query takes positional parameters ($1, $2 …) or named ones (`:run_id`), never
both. Named ones are numbered in order of first use when the file is loaded, and
a call must pass exactly those names as keywords: a swapped pair is a wrong name,
not a silently wrong value. A `:fragment` is SQL that several queries share: it
is never run by itself, and a query includes it with `{{name}}`, or with
`{{name(a, b)}}` when the fragment stands for what differs between its users (an alias,
a parameter, `$3` or `:reader`): `@1`, `@2` … in its text are those arguments.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from control_plane.store.errors import DataRefused
from telemetry import tracing

SQL_DIR = Path(__file__).parent / "sql"
# The current schema in one file, for readers: no named queries, never run (the
# migrations build every database; tests/integration/test_schema_file.py keeps the two
# equal). load_all() skips it.
SCHEMA_FILE = SQL_DIR / "schema.sql"
_HEADER = re.compile(r"^-- name: (\w+) :(one|many|exec|fragment)\s*$", re.MULTILINE)
# `:name` but not the `::type` of a cast (nor a `:` inside a word, such as a time literal).
_NAMED = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_POSITIONAL = re.compile(r"\$\d")
_INCLUDE = re.compile(r"\{\{(\w+)(?:\(([^)]*)\))?\}\}")
_FRAGMENT_ARGUMENT = re.compile(r"@(\d)")


@dataclass(frozen=True)
class Query:
    name: str
    mode: str
    sql: str
    source: str
    # The parameter names, $1 first; empty for a query with positional parameters.
    params: tuple[str, ...] = ()


def _code(line: str) -> str:
    """A line without its `--` comment (descriptions may mention parameters)."""
    return line.split("--", 1)[0]


def bind_names(name: str, sql: str) -> tuple[str, tuple[str, ...]]:
    """The SQL with each `:name` replaced by its $n, and the names in $n order."""
    params: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in params:
            params.append(match.group(1))
        return f"${params.index(match.group(1)) + 1}"

    lines = []
    for line in sql.splitlines():
        code = _code(line)
        lines.append(_NAMED.sub(number, code) + line[len(code) :])
    if params and any(_POSITIONAL.search(_code(line)) for line in sql.splitlines()):
        raise ValueError(f"query {name} mixes $n and :name parameters")
    return "\n".join(lines), tuple(params)


def parse(text: str, source: str) -> dict[str, Query]:
    """Split one .sql file into its named queries (fragments still unexpanded)."""
    headers = list(_HEADER.finditer(text))
    if not headers and text.strip():
        raise ValueError(f"{source}: no '-- name:' headers")
    queries: dict[str, Query] = {}
    for i, match in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        body = text[match.end() : end].strip().rstrip(";")
        queries[match.group(1)] = Query(match.group(1), match.group(2), body, source)
    return queries


def _without_description(sql: str) -> str:
    lines = sql.splitlines()
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "\n".join(lines)


def _expand(query: Query, fragments: dict[str, str]) -> Query:
    def include(match: re.Match[str]) -> str:
        if match.group(1) not in fragments:
            raise ValueError(f"query {query.name} includes unknown fragment {match.group(1)}")
        given = [a.strip() for a in match.group(2).split(",")] if match.group(2) else []

        def argument(at: re.Match[str]) -> str:
            n = int(at.group(1))
            if not 1 <= n <= len(given):
                raise ValueError(f"query {query.name} gives {match.group(1)} no argument {n}")
            return given[n - 1]

        # A fragment may include others (run_list_filter includes run_visible).
        return _INCLUDE.sub(include, _FRAGMENT_ARGUMENT.sub(argument, fragments[match.group(1)]))

    sql, params = bind_names(query.name, _INCLUDE.sub(include, query.sql))
    return Query(query.name, query.mode, sql, query.source, params)


def load_all(directory: Path = SQL_DIR) -> dict[str, Query]:
    """Every named query of every .sql file in the directory but the schema file,
    fragments included and names bound; names are unique."""
    found: dict[str, Query] = {}
    for path in sorted(directory.glob("*.sql")):
        if path.name == SCHEMA_FILE.name:
            continue
        for name, query in parse(path.read_text(), path.name).items():
            if name in found:
                raise ValueError(f"query {name} defined in {found[name].source} and {path.name}")
            found[name] = query
    fragments = {n: _without_description(q.sql) for n, q in found.items() if q.mode == "fragment"}
    return {n: _expand(q, fragments) for n, q in found.items() if q.mode != "fragment"}


QUERIES = load_all()
_tracer = tracing.tracer(__name__)


def arguments(query: Query, args: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, ...]:
    """The positional arguments of a call: as given, or the named ones in $n order."""
    if not query.params:
        if named:
            raise TypeError(f"query {query.name} takes positional parameters")
        return args
    if args or set(named) != set(query.params):
        missing, extra = set(query.params) - set(named), set(named) - set(query.params)
        raise TypeError(
            f"query {query.name} takes {query.params} by name"
            f" (missing {sorted(missing)}, unknown {sorted(extra)})"
        )
    return tuple(named[p] for p in query.params)


async def run(
    conn: asyncpg.pool.Pool | asyncpg.Connection, name: str, *args: Any, **named: Any
) -> Any:
    """Run a named query with the asyncpg call its mode asks for.

    Values Postgres refuses (a NUL in text, an out-of-range number) raise DataRefused.
    """
    query = QUERIES[name]
    values = arguments(query, args, named)
    with _span(name):
        try:
            if query.mode == "one":
                return await conn.fetchrow(query.sql, *values)
            if query.mode == "many":
                return await conn.fetch(query.sql, *values)
            return await conn.execute(query.sql, *values)
        except asyncpg.DataError as exc:
            raise DataRefused(f"{query.name}: {refusal(exc)}") from exc


_NO_SPAN = contextlib.nullcontext()


def _span(name: str) -> contextlib.AbstractContextManager[object]:
    """One client span per statement, named by the query (never its values: they may be
    secret); none when this process exports no spans (the hot path: not even a no-op one)."""
    # Only inside a traced request, commit or run: a statement alone (a background loop's
    # poll, mostly finding nothing to do) starts no root span of its own.
    if not tracing.on() or not trace.get_current_span().is_recording():
        return _NO_SPAN
    return _tracer.start_as_current_span(
        name,
        kind=SpanKind.CLIENT,
        attributes={"db.system.name": "postgresql", "db.query.summary": name},
    )


# asyncpg's own refusal of a value, before it is sent: "invalid input for query argument
# $2: 'the value' (why)". The message may reach the caller (status_for): the value may be
# anything the statement carries, so it is left out.
_ARGUMENT = re.compile(r"^(invalid input for query argument \$\d+): .*(\([^()]*\))$", re.S)


def refusal(exc: asyncpg.DataError) -> str:
    """What was wrong with a refused value, without the value when asyncpg quotes it
    (Postgres's own messages quote at most the caller's text, as in an invalid UUID)."""
    text = str(exc)
    if getattr(exc, "severity", None) is None:  # refused by asyncpg, not by the server
        return (
            _ARGUMENT.sub(r"\1 \2", text) if _ARGUMENT.match(text) else "a value of the wrong type"
        )
    return text
