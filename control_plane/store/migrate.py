"""Forward-only SQL migrations: apply every migrations/NNNN_name.sql not yet recorded.

Each file runs in its own transaction together with the row that records it in
`schema_migrations`, so a migration is either fully applied and recorded or not at all. A
session-level advisory lock serialises concurrent callers (two replicas starting at once): the
second waits, then finds nothing left to do. A file whose content changed after it was applied
is refused; fixes go in a new file. Files run as one multi-statement script, so a migration
cannot use statements that refuse a transaction block (CREATE INDEX CONCURRENTLY).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

# Advisory locks are per database; any fixed key works. This one spells "agentrun".
MIGRATION_LOCK_KEY = int.from_bytes(b"agentrun", "big")
_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     text PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
_SELECT_APPLIED = "SELECT version, name, checksum FROM schema_migrations"
_RECORD = "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"
_RENUMBER = "UPDATE schema_migrations SET version = $1 WHERE version = $2 AND checksum = $3"

# What DDL on a Citus cluster's distributed tables needs (control_plane/store/citus.py
# distributes them), set for the distribution and for every later migration there.
CITUS_DDL_SETTINGS = {
    # Triggers on `runs` write other tables (running counts, next wake, sessions,
    # credits, parents). On a shard they fire on the worker and reach those tables
    # through Citus, which it calls unsafe and refuses unless told; the rows they write
    # are co-located, so each such write stays on the worker that fired it.
    "citus.enable_unsafe_triggers": "on",
    # DDL in one transaction after reading reference tables and dropping keys.
    "citus.multi_shard_modify_mode": "sequential",
}


class MigrationError(RuntimeError):
    """The migrations cannot be applied as they are."""


class MigrationChecksumError(MigrationError):
    """A migration that was already applied has been edited since."""


class MigrationOrderError(MigrationError):
    """A pending migration is numbered below one already applied: history would fork."""


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: str
    name: str
    sql: str
    checksum: str

    @property
    def label(self) -> str:
        return f"{self.version}_{self.name}"

    @classmethod
    def load(cls, path: Path) -> Migration:
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_name.sql")
        data = path.read_bytes()
        return cls(
            version=match["version"],
            name=match["name"],
            sql=data.decode("utf-8"),
            checksum=hashlib.sha256(data).hexdigest(),
        )


def migrations_dir() -> Path:
    """The repository's migrations/ directory."""
    return Path(__file__).resolve().parents[2] / "migrations"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Every migration in `directory` (default: migrations_dir()), in version order."""
    paths = sorted((directory or migrations_dir()).glob("*.sql"))
    migrations = [Migration.load(path) for path in paths]
    versions = [m.version for m in migrations]
    duplicates = sorted({v for v in versions if versions.count(v) > 1})
    if duplicates:
        raise MigrationError(f"several migration files share version(s) {', '.join(duplicates)}")
    return migrations


async def migrate(
    conn_or_dsn: asyncpg.Connection | str, directory: Path | None = None
) -> list[str]:
    """Apply the pending migrations; return their labels ("0001_core"), in order applied."""
    if isinstance(conn_or_dsn, str):
        return await migrate_url(conn_or_dsn, directory)
    conn = conn_or_dsn
    migrations = load_migrations(directory)
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(_CREATE_TABLE)
        applied = await conn.fetch(_SELECT_APPLIED)
        for old_version, migration in _renumbered(migrations, applied):
            await conn.execute(_RENUMBER, migration.version, old_version, migration.checksum)
        pending = _pending(migrations, await conn.fetch(_SELECT_APPLIED))
        on_citus = bool(pending) and await _on_citus(conn)
        for migration in pending:
            await _apply(conn, migration, on_citus)
        return [m.label for m in pending]
    finally:
        if not conn.is_closed():
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def migrate_url(dsn: str, directory: Path | None = None) -> list[str]:
    """Connect to `dsn`, apply the pending migrations, close; return what was applied."""
    conn = await asyncpg.connect(dsn)
    try:
        return await migrate(conn, directory)
    finally:
        await conn.close()


async def set_citus_ddl_settings(conn: asyncpg.Connection, *, local: bool) -> None:
    """CITUS_DDL_SETTINGS, for the transaction (`local`) or the session."""
    for name, value in CITUS_DDL_SETTINGS.items():
        await conn.execute("SELECT set_config($1, $2, $3)", name, value, local)


# What can hold a `;` that does not end a statement, and the `;` that does.
_TOKEN = re.compile(r"--[^\n]*|/\*|'|\"|\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$|;")
_COMMENT_MARK = re.compile(r"/\*|\*/")


def split_statements(sql: str) -> list[str]:
    """A migration's statements, one string each (quotes, dollar-quoted bodies and comments
    kept whole). A Citus coordinator needs them one at a time: DDL on a distributed table
    inside a multi-statement string fails there ("cannot insert multiple commands into a
    prepared statement")."""
    statements: list[str] = []
    start = i = 0
    while match := _TOKEN.search(sql, i):
        token = match.group()
        if token == ";":
            statements.append(sql[start : match.end()])
            start = i = match.end()
        elif token.startswith("--"):
            i = match.end()
        elif token == "/*":
            i = _block_comment_end(sql, match.end())
        elif token in ("'", '"'):
            i = _quote_end(sql, match.end(), token)
        else:  # a dollar quote: up to the same tag
            end = sql.find(token, match.end())
            if end < 0:
                raise MigrationError(f"unterminated dollar quote {token}")
            i = end + len(token)
    statements.append(sql[start:])
    return [s for s in statements if s.strip()]


def _quote_end(sql: str, i: int, quote: str) -> int:
    while True:
        end = sql.find(quote, i)
        if end < 0:
            raise MigrationError(f"unterminated {quote} quote")
        if sql.startswith(quote, end + 1):  # a doubled quote stands for itself
            i = end + 2
            continue
        return end + 1


def _block_comment_end(sql: str, i: int) -> int:
    depth = 1  # block comments nest in PostgreSQL
    while depth:
        match = _COMMENT_MARK.search(sql, i)
        if match is None:
            raise MigrationError("unterminated /* comment")
        depth += 1 if match.group() == "/*" else -1
        i = match.end()
    return i


async def _on_citus(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'citus'"))


def _pending(migrations: list[Migration], applied_rows: list[asyncpg.Record]) -> list[Migration]:
    """The migrations not applied yet, after checking the applied ones are unchanged."""
    applied = {row["version"]: row for row in applied_rows}
    for migration in migrations:
        row = applied.get(migration.version)
        if row is not None and row["checksum"] != migration.checksum:
            raise MigrationChecksumError(
                f"migration {migration.label} was applied as {row['version']}_{row['name']} "
                f"and its file has changed since (checksum {row['checksum'][:12]} in the "
                f"database, {migration.checksum[:12]} on disk); add a new migration instead"
            )
    # Versions recorded but absent here come from a newer release (a rolling deploy): fine.
    pending = [m for m in migrations if m.version not in applied]
    newest = max(applied, default="")
    early = [m.label for m in pending if m.version < newest]
    if early:
        raise MigrationOrderError(
            f"migration(s) {', '.join(early)} are numbered below {newest}, which is already "
            "applied; a new migration takes the next number after every applied one"
        )
    return pending


def _renumbered(
    migrations: list[Migration], applied_rows: list[asyncpg.Record]
) -> list[tuple[str, Migration]]:
    """(recorded version, file) for applied migrations whose file now has another number.

    The same name and the same bytes under a new number is the same migration
    (the files were renumbered to read in order): its record follows the file
    instead of the file being applied twice. In ascending order of the new
    number, so each record moves into a number already vacated.
    """
    recorded = {(row["name"], row["checksum"]): row["version"] for row in applied_rows}
    versions = {row["version"] for row in applied_rows}
    moves = []
    for migration in migrations:
        old = recorded.get((migration.name, migration.checksum))
        if old is not None and old != migration.version and migration.version not in versions:
            moves.append((old, migration))
            versions.discard(old)
            versions.add(migration.version)
    return sorted(moves, key=lambda move: move[1].version)


async def _apply(conn: asyncpg.Connection, migration: Migration, on_citus: bool) -> None:
    try:
        async with conn.transaction():
            if on_citus:
                await set_citus_ddl_settings(conn, local=True)
                for statement in split_statements(migration.sql):
                    await conn.execute(statement)
            else:
                await conn.execute(migration.sql)
            await conn.execute(_RECORD, migration.version, migration.name, migration.checksum)
    except asyncpg.PostgresError as exc:
        raise MigrationError(f"migration {migration.label} failed: {exc}") from exc
