"""Test databases: one migrated template per session, one copy of it per test."""

from __future__ import annotations

import uuid

import asyncpg

from control_plane.store.migrate import migrate

TEMPLATE_DB = "agentrun_template"


def new_database_name(prefix: str = "test") -> str:
    """A fresh database name, unique across concurrent test sessions."""
    return f"{prefix}_{uuid.uuid4().hex}"


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


async def create_database(admin_url: str, name: str, template: str | None = None) -> None:
    """CREATE DATABASE name [TEMPLATE template], through a connection to admin_url."""
    sql = f"CREATE DATABASE {_quoted(name)}"
    if template is not None:
        sql += f" TEMPLATE {_quoted(template)}"
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def drop_database(admin_url: str, name: str) -> None:
    """DROP DATABASE IF EXISTS name WITH (FORCE): connections left open are terminated."""
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")
    finally:
        await conn.close()


async def create_template(admin_url: str, template_url: str) -> list[str]:
    """(Re)create TEMPLATE_DB and migrate it; return the migrations applied.

    migrate() closes its connection, as it must: PostgreSQL refuses to copy a template that
    anyone is connected to.
    """
    await drop_database(admin_url, TEMPLATE_DB)
    await create_database(admin_url, TEMPLATE_DB)
    return await migrate(template_url)
