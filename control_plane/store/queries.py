"""Loads the named SQL queries in sql/*.sql and runs them through asyncpg.

Each query opens with `-- name: <name> :one|:many|:exec` and a description
line (River and procrastinate keep their SQL the same way). `:one` maps to
fetchrow, `:many` to fetch, `:exec` to execute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

SQL_DIR = Path(__file__).parent / "sql"
_HEADER = re.compile(r"^-- name: (\w+) :(one|many|exec)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Query:
    name: str
    mode: str
    sql: str
    source: str


def parse(text: str, source: str) -> dict[str, Query]:
    """Split one .sql file into its named queries."""
    headers = list(_HEADER.finditer(text))
    if not headers and text.strip():
        raise ValueError(f"{source}: no '-- name:' headers")
    queries: dict[str, Query] = {}
    for i, match in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        body = text[match.end() : end].strip().rstrip(";")
        queries[match.group(1)] = Query(match.group(1), match.group(2), body, source)
    return queries


def load_all(directory: Path = SQL_DIR) -> dict[str, Query]:
    """Every named query of every .sql file in the directory; names are unique."""
    found: dict[str, Query] = {}
    for path in sorted(directory.glob("*.sql")):
        for name, query in parse(path.read_text(), path.name).items():
            if name in found:
                raise ValueError(f"query {name} defined in {found[name].source} and {path.name}")
            found[name] = query
    return found


QUERIES = load_all()


async def run(conn: asyncpg.pool.Pool | asyncpg.Connection, name: str, *args: Any) -> Any:
    """Run a named query with the asyncpg call its mode asks for."""
    query = QUERIES[name]
    if query.mode == "one":
        return await conn.fetchrow(query.sql, *args)
    if query.mode == "many":
        return await conn.fetch(query.sql, *args)
    return await conn.execute(query.sql, *args)
