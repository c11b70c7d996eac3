"""Migrations: idempotent, safe when run concurrently, refusing newer schemas; drift check."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import itertools
import os
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from durq.brokers.postgres import PostgresBroker
from durq.brokers.postgres.storage import MIGRATIONS, QUERIES, render
from durq.errors import SchemaError
from durq.states import TaskState
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
    from tests.brokers.postgres.conftest import drop_schema

    drop_schema(schema)
    with pytest.raises(SchemaError, match="run `durq migrate`"):
        await pg.admin.list_queues()


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
    await migrated(pg_url)
    actual = describe(schema)
    if os.environ.get("DURQ_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(actual)
    assert actual == SNAPSHOT.read_text()


async def test_every_task_field_has_a_column(pg_url: str, schema: str) -> None:
    await migrated(pg_url)
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
    for required in ("complete_claim", "enqueue", "complete", "extend_leases", "expired_leases"):
        assert required in named


async def test_priority_migration_keeps_existing_tasks_claimable_in_order(
    pg_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the schema before priority with tasks in every waiting state: after migrating,
    each has priority 0 and the claim takes the due ones in due-time order."""
    from durq.brokers.base import ClaimParams
    from durq.brokers.postgres import storage
    from durq.clock import FakeClock

    (adding,) = [m for m in MIGRATIONS if m.label.endswith("_priority")]
    before = [m for m in MIGRATIONS if m.version < adding.version]
    monkeypatch.setattr(storage, "MIGRATIONS", tuple(before))
    old = PostgresBroker.from_url(pg_url)
    try:
        assert await old.migrate() == [m.label for m in before]
    finally:
        await old.close()
    monkeypatch.undo()

    t0 = 1_800_000_000.0
    rows = [  # id, state, next_process_at
        ("late", "pending", t0 + 1),
        ("early", "pending", t0),
        ("due-scheduled", "scheduled", t0 + 0.5),
        ("future-retry", "retry", t0 + 3600),
        ("done", "completed", t0),
    ]
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for task_id, state, at in rows:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.tasks (queue, id, type, payload, state, max_retry, "
                    "next_process_at, enqueued_at, expires_at) "
                    "VALUES ('default', %s, 't', '{{}}', %s, 3, %s, %s, %s)"
                ).format(sql.Identifier(schema)),
                (task_id, state, at, t0, t0 + 3600 if state == "completed" else None),
            )

    clock = FakeClock(t0 + 10)
    broker = PostgresBroker.from_url(pg_url, clock=clock)
    try:
        assert adding.label in await broker.migrate()
        await broker.connect()
        assert {
            t.priority for t in await broker.admin.list_tasks("default", TaskState.PENDING)
        } == {0}
        got = await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        assert [lease.task.id for lease in got] == ["early", "due-scheduled", "late"]
        assert (await broker.admin.get_task("default", "future-retry")).state is TaskState.RETRY
        assert (await broker.admin.get_task("default", "done")).priority == 0
    finally:
        await broker.close()
    with psycopg.connect(PG_DSN) as conn:
        (definition,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = %s",
            (schema, "tasks_claimable"),
        ).fetchone() or (None,)
    assert definition is not None and "priority DESC" in definition


async def migrated(pg_url: str) -> None:
    """Create the schema of ``pg_url`` (and nothing else)."""
    broker = PostgresBroker.from_url(pg_url)
    try:
        await broker.migrate()
    finally:
        await broker.close()


def claim_plan(schema: str, name: str, **params: object) -> list[str]:
    """EXPLAIN of one claim statement, planner costs put aside (enable_seqscan and
    enable_sort off) as for a large table."""
    text = render(QUERIES[name], schema).decode().replace("b::", "s::")
    values = {"queues": ["default"], "now": 0.0, "lease_seconds": 30.0, "worker_id": "w"}
    with psycopg.connect(PG_DSN) as conn:
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_sort = off")
        lines = [r[0] for r in conn.execute("EXPLAIN " + text, {**values, **params})]
        conn.rollback()
    return lines


def locked_off(lines: list[str], index: str) -> bool:
    """Whether rows read through ``index`` are locked straight off it (no sort between)."""
    (at,) = [i for i, line in enumerate(lines) if f"Index Scan using {index} " in line]
    return "LockRows" in lines[at - 1]


def complete_claim_plan(schema: str) -> list[str]:
    """The plan of a busy worker's claim (``complete_claim``) with no completions to store."""
    nothing: list[object] = []
    return claim_plan(
        schema,
        "complete_claim",
        limit=10,
        take=10,
        check_due=True,
        task_queues=nothing,
        ids=nothing,
        tokens=nothing,
        results=nothing,
        retentions=nothing,
        day=datetime.date(2026, 1, 1),
    )


async def test_claim_reads_the_claim_index_in_order(pg_url: str, schema: str) -> None:
    """The claim's per-queue scan walks tasks_claimable in claim order: no sort, no seq scan;
    with completions (complete_claim) and without (claim)."""
    await migrated(pg_url)
    lines = complete_claim_plan(schema)
    assert locked_off(lines, "tasks_claimable"), "\n".join(lines)
    lines = claim_plan(schema, "claim", limit=10, take=10, check_due=True)
    assert locked_off(lines, "tasks_claimable"), "\n".join(lines)


def test_the_claim_that_picks_up_a_task_is_short_enough_for_psycopg_to_cache() -> None:
    """psycopg parses a statement's text again on every call when it is longer than its
    cache limit; complete_claim is (a tenth of a millisecond of the worker's CPU per call):
    the claim without completions, which an idle worker sends when woken, stays under it."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    assert len(render(QUERIES["claim"], "durq")) <= MAX_CACHED_STATEMENT_LENGTH


async def test_claim_of_limited_tasks_reads_through_the_indexes(pg_url: str, schema: str) -> None:
    """The claim of limited tasks reads due rows through tasks_claimable and held ones
    through tasks_held, each locked straight off its index, the keys with held tasks through
    limits_waiting and the counters it locks through limits_pkey: nothing scans the tables."""
    await migrated(pg_url)
    keys = {"queues": ["default"], "keys": ["k"]}
    plans = {
        "limited_due": claim_plan(schema, "limited_due", limit=10),
        "held_tasks": claim_plan(schema, "held_tasks", limit=10),
        "waiting_limits": claim_plan(schema, "waiting_limits"),
        "lock_limits": claim_plan(schema, "lock_limits", **keys),
    }
    assert locked_off(plans["limited_due"], "tasks_claimable"), plans
    assert locked_off(plans["held_tasks"], "tasks_held"), plans
    assert "limits_waiting" in "\n".join(plans["waiting_limits"]), plans
    assert "limits_pkey" in "\n".join(plans["lock_limits"]), plans
    for lines in plans.values():
        assert "Seq Scan" not in "\n".join(lines), plans


async def test_claim_forward_reads_due_rows_by_queue_and_state(pg_url: str, schema: str) -> None:
    """Moving due scheduled and retry rows to pending reads tasks_by_state on the queue AND
    the state: a backlog of pending or held rows is never read on the way (with the state
    left to a filter, every claim read every row of the queue)."""
    await migrated(pg_url)
    lines = claim_plan(schema, "claim_forward", forward=100)
    plan = "\n".join(lines)
    conds = [line for line in lines if "Index Cond" in line and "next_process_at" in line]
    assert conds and all("state = " in line for line in conds), plan
    assert "Filter: (state" not in plan and "Seq Scan" not in plan, plan


async def test_the_claims_check_for_due_rows_reads_due_rows_only(pg_url: str, schema: str) -> None:
    """complete_claim's check for due scheduled and retry rows reads nothing else: each
    probe has the due time in its index condition, on tasks_due (which holds scheduled and
    retry rows only) or on tasks_by_state with the queue AND the state. A backlog of pending
    or held rows is never read on the way."""
    await migrated(pg_url)
    lines = complete_claim_plan(schema)
    plan = "\n".join(lines)
    probes = [
        (scan, cond)
        for scan, cond in itertools.pairwise(lines)
        if "Index Cond" in cond and "next_process_at <=" in cond
    ]
    assert len(probes) == 2, plan
    for scan, cond in probes:
        assert "tasks_due" in scan or ("tasks_by_state" in scan and "state = " in cond), plan
    assert "Seq Scan" not in plan, plan


async def test_the_promoter_reads_due_rows_only(pg_url: str, schema: str) -> None:
    """The promoter's pass over every queue reads due scheduled and retry rows through
    tasks_due and waits for a signal through tasks_awaits, earliest first and locked straight
    off each: never the rest of the table, which holds the queues' history."""
    await migrated(pg_url)
    lines = claim_plan(schema, "promote_due", limit=100, channel="durq")
    plan = "\n".join(lines)
    assert locked_off(lines, "tasks_due"), plan
    assert locked_off(lines, "tasks_awaits"), plan
    assert "Seq Scan" not in plan, plan
