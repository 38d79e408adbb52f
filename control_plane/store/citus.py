"""Where each table lives on a Citus cluster, and the step that puts it there.

agentrun runs unchanged on one PostgreSQL. On Citus (the coordinator's database, the
extension installed and the workers added) `agentrun migrate --citus` applies the
ordinary migrations on the coordinator and then distributes the schema by this plan:

* **Distributed by `workspace_id`, all co-located with `workspaces`**: every table whose
  rows belong to one workspace. Shard *k* of each sits on the same worker, so a statement
  that names one workspace, the triggers it fires and the foreign keys it checks stay in
  one single-shard transaction on one worker. `tools` holds the platform's shared
  built-ins under workspace '' : a lookup of "mine or shared" reads two shards.
* **Reference tables** (a copy on every node): small, rarely written, read by statements
  that run on the workers (`plans` by the workspaces' foreign key and the caps,
  `releases` by the claim's routing).
* **Coordinator-local**: looked up by something other than a workspace (a key id, a
  cookie's or an OAuth state's hash, an executor id) and never joined in a hot
  statement, and the claim's line of workspaces (`workspace_turns`), where a claim
  takes its turns before its lease step on each shard (`agentrun_shard_of`). Citus allows no foreign key from such a table to a distributed one, so
  their `workspace_id` references are dropped (the API creates those rows only for a
  workspace it has just read).

Citus accepts this only in a certain order: a reference table turns every table tied to it
by a foreign key into a Citus-local table, so all foreign keys are dropped first, the tables
are distributed, and the keys Citus allows are added back. Everything runs in one
transaction: a failure leaves the database as the migrations left it.

Identity columns (`audit_log`, `credit_ledger`) are bigint, which Citus distributes: each
node draws from its own range, so an insert that a worker runs (a trigger firing on a
shard) never collides with one the coordinator routes. `run_signals.arrival` is a bigint
sequence, distributed the same way.

The nine triggers on `runs` still write other tables from the shard they fire on, which
Citus calls unsafe; migrate.CITUS_DDL_SETTINGS allows them here and in every later migration.
Moving that work into the statements is the way out (docs/scaling.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from control_plane.store.migrate import MIGRATION_LOCK_KEY, migrate, set_citus_ddl_settings

DISTRIBUTION_COLUMN = "workspace_id"
# The table every distributed table is co-located with.
ANCHOR = "workspaces"

REFERENCE_TABLES = ("plans", "releases")

COORDINATOR_TABLES = (
    "schema_migrations",
    "api_keys",
    "console_sessions",
    "connection_flows",
    "executor_tools",
    # The claim's line of workspaces (migrations/0047_claim_per_shard.sql): turns are
    # taken here, then the lease step runs on each shard holding one of them.
    "workspace_turns",
)

# On Citus a trigger firing on a shard cannot reach workspace_turns on the coordinator:
# lowering a workspace's next_wake_at writes workspace_wakes beside its runs instead, and
# each claim folds the due ones into workspace_turns (migrations/0047_claim_per_shard.sql).
# PL/pgSQL, not SQL: a resume calls it from the coordinator (pause.sql's workspace_lower_wake),
# where Citus plans no parameterised SQL function over a distributed table.
LOWER_NEXT_WAKE = """
CREATE OR REPLACE FUNCTION workspace_lower_next_wake(ws text, wake timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_wakes AS w (workspace_id, wake_at) VALUES (ws, wake)
    ON CONFLICT (workspace_id) DO UPDATE SET wake_at = excluded.wake_at
    WHERE w.wake_at > excluded.wake_at;
END $$
"""

# The claim's lease step, as Citus needs it: it plans its statements generically on one
# PostgreSQL (its plans do not depend on the arrays given), but Citus prunes
# `workspace_id = ANY(...)` to one shard only with the values in the plan, so there it plans
# them for each call's values; and it counts its fresh runs itself only where the row trigger
# sees its agentrun.claim_counts (a trigger on a shard fires on the worker, which does not).
_CLAIM_SHARD = (
    "agentrun_claim_shard(text[], double precision, timestamptz, text[], jsonb, text[], text,"
    " double precision, boolean)"
)
CLAIM_SETTINGS = (
    f"ALTER FUNCTION {_CLAIM_SHARD} SET plan_cache_mode = force_custom_plan",
    f"ALTER FUNCTION {_CLAIM_SHARD} SET agentrun.claim_counts = 'off'",
)

# On Citus the claim groups its turns by this: the shard of `runs` (co-located with every
# distributed table) that holds the workspace. The migrations define it as 0, one shard.
SHARD_OF = """
CREATE OR REPLACE FUNCTION agentrun_shard_of(ws text) RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT get_shard_id_for_distribution_column('runs', ws) $$
"""

DISTRIBUTED_TABLES = (
    ANCHOR,
    "agents",
    "agent_versions",
    "tools",
    "mcp_servers",
    "runs",
    "steps",
    "payloads",
    "payload_chunks",
    "run_signals",
    "events",
    "event_shapes",
    "event_waits",
    "event_deliveries",
    "concurrency_keys",
    "workspace_running_counts",
    "agent_running_counts",
    "workspace_wakes",
    "approvals",
    "unknown_questions",
    "approval_tokens",
    "outbox",
    "channels",
    "alert_rules",
    "triggers",
    "trigger_secrets",
    "trigger_events",
    "trigger_flow_groups",
    "sessions",
    "session_turns",
    "session_members",
    "connections",
    "credit_accounts",
    "credit_ledger",
    "workspace_members",
    "audit_log",
    "workspace_data_keys",
    "streams",
    "stream_messages",
    "stream_producers",
    "workspace_events",
    "run_deltas",
)

PLANNED = frozenset(REFERENCE_TABLES + COORDINATOR_TABLES + DISTRIBUTED_TABLES)

_FOREIGN_KEYS = """
SELECT c.conname, c.conrelid::regclass::text AS tbl, c.confrelid::regclass::text AS ref,
       pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c
WHERE c.contype = 'f' AND c.connamespace = 'public'::regnamespace
ORDER BY c.conrelid::regclass::text, c.conname
"""
_TABLES = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
"""
_PLACED = """
SELECT logicalrelid::regclass::text AS tbl, partmethod FROM pg_dist_partition
WHERE logicalrelid::regclass::text = ANY($1::text[])
"""


class CitusError(RuntimeError):
    """The database cannot be distributed as planned (no Citus, or a table off the plan)."""


@dataclass(frozen=True)
class ForeignKey:
    name: str
    table: str
    references: str
    definition: str

    @property
    def kept(self) -> bool:
        """Citus allows it: not from a coordinator-local table to a distributed one."""
        return not (self.table in COORDINATOR_TABLES and self.references in DISTRIBUTED_TABLES)


async def has_citus(conn: asyncpg.Connection) -> bool:
    """Whether the citus extension is installed in this database."""
    return bool(await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'citus'"))


async def require_citus(conn: asyncpg.Connection) -> None:
    """Raise CitusError unless the citus extension is installed (checked before anything runs)."""
    if not await has_citus(conn):
        raise CitusError(
            "the citus extension is not installed in this database: run "
            "`CREATE EXTENSION citus` on the coordinator and every worker, add the workers "
            "(citus_add_node), then migrate --citus again; nothing was changed"
        )


async def unplanned_tables(conn: asyncpg.Connection) -> list[str]:
    """Tables of the schema that the plan does not place (a new table must be added to it)."""
    names = {row["relname"] for row in await conn.fetch(_TABLES)}
    return sorted(names - PLANNED)


async def distribute(conn: asyncpg.Connection, shard_count: int | None = None) -> list[str]:
    """Place every table by the plan, in one transaction; return what was placed.

    Tables already placed are left alone, so a second run does nothing.
    """
    await require_citus(conn)
    async with conn.transaction():
        # Two replicas migrating at once: the second waits, then finds everything placed.
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await set_citus_ddl_settings(conn, local=True)
        missing = await unplanned_tables(conn)
        if missing:
            raise CitusError(f"tables not in control_plane/store/citus.py's plan: {missing}")
        placed = {row["tbl"] for row in await conn.fetch(_PLACED, list(PLANNED))}
        await conn.execute(SHARD_OF)
        await conn.execute(LOWER_NEXT_WAKE)
        for statement in CLAIM_SETTINGS:
            await conn.execute(statement)
        todo_reference = [t for t in REFERENCE_TABLES if t not in placed]
        todo_distributed = [t for t in DISTRIBUTED_TABLES if t not in placed]
        if not todo_reference and not todo_distributed:
            return []
        keys = [ForeignKey(*row) for row in await conn.fetch(_FOREIGN_KEYS)]
        for key in keys:
            await conn.execute(f"ALTER TABLE {key.table} DROP CONSTRAINT {key.name}")
        for table in todo_reference:
            await conn.execute("SELECT create_reference_table($1)", table)
        for table in todo_distributed:
            await _distribute_table(conn, table, shard_count)
        for key in keys:
            if key.kept:
                await conn.execute(
                    f"ALTER TABLE {key.table} ADD CONSTRAINT {key.name} {key.definition}"
                )
        return todo_reference + todo_distributed


async def migrate_and_distribute(dsn: str, shard_count: int | None = None) -> list[str]:
    """`agentrun migrate --citus`: check for Citus first, apply the pending migrations on
    the coordinator, then distribute; return the tables placed now."""
    conn = await asyncpg.connect(dsn)
    try:
        await require_citus(conn)
        await migrate(conn)
        return await distribute(conn, shard_count)
    finally:
        await conn.close()


async def _distribute_table(conn: asyncpg.Connection, table: str, shard_count: int | None) -> None:
    if table == ANCHOR:
        if shard_count is None:
            await conn.execute(
                "SELECT create_distributed_table($1, $2)", table, DISTRIBUTION_COLUMN
            )
        else:
            await conn.execute(
                "SELECT create_distributed_table($1, $2, shard_count => $3)",
                table,
                DISTRIBUTION_COLUMN,
                shard_count,
            )
        return
    await conn.execute(
        "SELECT create_distributed_table($1, $2, colocate_with => $3)",
        table,
        DISTRIBUTION_COLUMN,
        ANCHOR,
    )
