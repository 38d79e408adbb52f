"""split_statements: a migration cut at the semicolons that end statements, and only those."""

from __future__ import annotations

import pytest

from control_plane.store.migrate import MigrationError, load_migrations, split_statements


def test_semicolons_inside_quotes_bodies_and_comments_do_not_split() -> None:
    sql = """
-- a comment; with a semicolon and a quote '
CREATE TABLE t (a text DEFAULT 'x;y''z;', "b;c" int);
/* block; /* nested; */ still; */
CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;
DO $outer$ BEGIN EXECUTE $inner$ SELECT 2; $inner$; END $outer$;
SELECT $1::int;
"""
    parts = split_statements(sql)
    assert [p.strip().split()[0] for p in parts] == ["--", "/*", "DO", "SELECT"]
    assert "".join(parts).strip() == sql.strip()


@pytest.mark.parametrize("sql", ["SELECT 'open", "SELECT $x$ open", "/* open", 'SELECT "open'])
def test_an_unterminated_quote_or_comment_is_refused(sql: str) -> None:
    with pytest.raises(MigrationError):
        split_statements(sql)


def test_every_migration_splits_back_into_itself() -> None:
    for migration in load_migrations():
        parts = split_statements(migration.sql)
        assert parts, migration.label
        assert "".join(parts).strip() == migration.sql.strip(), migration.label
