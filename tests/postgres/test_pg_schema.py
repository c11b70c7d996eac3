"""Migrations: idempotent, safe when run concurrently, refusing newer schemas; drift check."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from durq.brokers.postgres import PostgresBroker
from durq.brokers.postgres.storage import MIGRATIONS, QUERIES
from durq.errors import SchemaError
from durq.task import TaskInfo
from servers import PG_DSN

SNAPSHOT = Path(__file__).with_name("schema_snapshot.txt")


def latest() -> int:
    return MIGRATIONS[-1].version


async def test_connect_without_schema_says_run_migrate(pg_url: str) -> None:
    broker = PostgresBroker.from_url(pg_url)
    with pytest.raises(SchemaError, match="run `durq migrate`") as caught:
        await broker.connect()
    assert caught.value.operation == "postgres.connect"
    await broker.close()


async def test_migrate_is_idempotent(pg_url: str) -> None:
    broker = PostgresBroker.from_url(pg_url)
    try:
        assert await broker.migrate() == [m.label for m in MIGRATIONS]
        assert await broker.migrate() == []
        await broker.connect()
        await broker.ping()
    finally:
        await broker.close()


async def test_concurrent_migrate_applies_once(pg_url: str) -> None:
    brokers = [PostgresBroker.from_url(pg_url) for _ in range(5)]
    try:
        results = await asyncio.gather(*(b.migrate() for b in brokers))
        assert sorted(len(r) for r in results) == [0, 0, 0, 0, len(MIGRATIONS)]
        await brokers[0].connect()
    finally:
        for b in brokers:
            await b.close()


def _set_version(schema: str, version: int) -> None:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.schema_migrations (version, name) VALUES (%s, 'future')"
            ).format(sql.Identifier(schema)),
            (version,),
        )


async def test_newer_schema_is_refused(pg_url: str, schema: str) -> None:
    broker = PostgresBroker.from_url(pg_url)
    try:
        await broker.migrate()
        _set_version(schema, latest() + 1)
        with pytest.raises(SchemaError, match="newer than this durq"):
            await broker.connect()
        with pytest.raises(SchemaError, match="newer than this durq"):
            await broker.migrate()
    finally:
        await broker.close()


async def test_older_schema_asks_for_migrate(pg_url: str, schema: str) -> None:
    broker = PostgresBroker.from_url(pg_url)
    try:
        await broker.migrate()
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DELETE FROM {}.schema_migrations WHERE version = %s").format(
                    sql.Identifier(schema)
                ),
                (latest(),),
            )
        with pytest.raises(SchemaError, match="run `durq migrate`"):
            await broker.connect()
    finally:
        await broker.close()


async def test_dropped_schema_while_connected_is_a_schema_error(pg, schema: str) -> None:
    from tests.postgres.conftest import drop_schema

    drop_schema(schema)
    with pytest.raises(SchemaError, match="run `durq migrate`"):
        await pg.list_queues()


def describe(schema: str) -> str:
    """Columns, constraints and indexes of a schema, one per line, in a stable order."""
    lines: list[str] = []
    with psycopg.connect(PG_DSN) as conn:
        for table, column, dtype, nullable, default in conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = %s "
            "ORDER BY table_name, ordinal_position",
            (schema,),
        ):
            lines.append(f"column {table}.{column} {dtype} null={nullable} default={default}")
        for table, name, definition in conn.execute(
            "SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
            "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s ORDER BY 1, 3",
            (schema,),
        ):
            lines.append(f"constraint {table} {definition.replace(schema, '<schema>')}")
        for table, name, definition in conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s "
            "ORDER BY 1, 2",
            (schema,),
        ):
            lines.append(f"index {table}.{name} {definition.replace(schema, '<schema>')}")
    return "\n".join(lines) + "\n"


async def test_drift_migrations_equal_the_schema_snapshot(pg_url: str, schema: str) -> None:
    """All migrations applied to an empty schema give exactly the reviewed snapshot.

    After adding a migration, regenerate with DURQ_UPDATE_SNAPSHOT=1 and review the diff."""
    broker = PostgresBroker.from_url(pg_url)
    try:
        await broker.migrate()
    finally:
        await broker.close()
    actual = describe(schema)
    if os.environ.get("DURQ_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(actual)
    assert actual == SNAPSHOT.read_text()


async def test_every_task_field_has_a_column(pg_url: str, schema: str) -> None:
    broker = PostgresBroker.from_url(pg_url)
    try:
        await broker.migrate()
    finally:
        await broker.close()
    with psycopg.connect(PG_DSN) as conn:
        columns = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = 'tasks'",
                (schema,),
            )
        }
    renamed = {"raw_payload": "payload", "raw_result": "result"}
    fields = {renamed.get(f.name, f.name) for f in dataclasses.fields(TaskInfo)}
    assert fields <= columns, fields - columns
    assert {"lease_token", "unique_key", "unique_until", "expires_at", "seq"} <= columns


def test_queries_file_has_no_duplicate_or_empty_blocks() -> None:
    named = QUERIES
    assert all(text.strip() for text in named.values())
    for required in ("claim", "enqueue", "complete", "extend_leases", "expired_leases"):
        assert required in named
