"""E8 on every broker that declares ``transactional_enqueue``: the task is written in the
caller's open transaction (commit makes it visible, rollback leaves nothing), through the
broker, the async App and the sync face. Redis lacks the capability: skipped by name."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from brokerkit import claim_ids, params

import durq
from conformance.conftest import requires
from durq import continuations, webhooks
from durq.brokers import FullBroker
from durq.brokers.base import CAP_TRANSACTIONAL_ENQUEUE
from durq.errors import (
    ConfigurationError,
    QueueNotFoundError,
    SchemaError,
    TaskIDConflictError,
)
from durq.states import TaskState


@pytest.fixture(autouse=True)
def _capable(broker: FullBroker) -> None:
    requires(broker, CAP_TRANSACTIONAL_ENQUEUE)


class Caller:
    """The application's own connection to the broker's database, with a business table."""

    def __init__(self, broker: FullBroker, conn: Any, is_async: bool) -> None:
        self.broker, self.conn, self.is_async = broker, conn, is_async

    async def execute(self, sql: str, *args: Any) -> None:
        if self.is_async:
            await self.conn.execute(sql, args)
        else:
            self.conn.execute(sql, args)

    async def commit(self) -> None:
        if self.is_async:
            await self.conn.commit()
        else:
            self.conn.commit()

    async def rollback(self) -> None:
        if self.is_async:
            await self.conn.rollback()
        else:
            self.conn.rollback()


def caller_dsn(broker: FullBroker) -> str:
    return str(broker._storage.dsn)  # type: ignore[attr-defined]


def orders(broker: FullBroker) -> str:
    """The caller's own table: in the broker's schema on PostgreSQL."""
    if broker.name == "sqlite":
        return "orders"
    return f'"{broker.schema}".orders'  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def caller(broker: FullBroker) -> AsyncIterator[Caller]:
    if broker.name == "sqlite":
        conn = sqlite3.connect(broker.path)  # type: ignore[attr-defined]
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)")
        conn.commit()
        try:
            yield Caller(broker, conn, False)
        finally:
            conn.close()
        return
    import psycopg

    # The caller's connection goes where the broker's go (through PgBouncer for that kind),
    # without session state or named prepared statements, like an application's behind it.
    conn = await psycopg.AsyncConnection.connect(caller_dsn(broker), prepare_threshold=None)
    await conn.execute(f"CREATE TABLE IF NOT EXISTS {orders(broker)} (id text PRIMARY KEY)")
    await conn.commit()
    try:
        yield Caller(broker, conn, True)
    finally:
        await conn.close()


async def pending(broker: FullBroker) -> list[str]:
    try:
        return sorted(t.id for t in await broker.admin.list_tasks("default", TaskState.PENDING))
    except QueueNotFoundError:
        return []


async def test_E8_commit_makes_order_and_task_visible(broker: FullBroker) -> None:
    async with caller(broker) as c:
        await c.execute(f"INSERT INTO {orders(c.broker)} (id) VALUES ({_mark(c)})", "o-1")
        info = await broker.enqueue(params("o-1"), connection=c.conn)
        assert info.state is TaskState.PENDING
        assert await pending(broker) == []  # not committed: invisible to others
        await c.commit()
    assert await pending(broker) == ["o-1"]
    assert await claim_ids(broker) == ["o-1"]


async def test_E8_rollback_leaves_nothing(broker: FullBroker) -> None:
    async with caller(broker) as c:
        await c.execute(f"INSERT INTO {orders(c.broker)} (id) VALUES ({_mark(c)})", "o-2")
        await broker.enqueue(params("o-2"), connection=c.conn)
        outcomes = await broker.enqueue_many([params("o-3"), params("o-4")], connection=c.conn)
        assert all(o.created for o in outcomes)
        await c.rollback()
    assert await pending(broker) == []
    assert (await broker.enqueue(params("o-2"))).id == "o-2"  # the id is free again


async def test_E8_conflict_keeps_the_callers_transaction_usable(broker: FullBroker) -> None:
    await broker.enqueue(params("taken"))
    async with caller(broker) as c:
        await broker.enqueue(params("mine"), connection=c.conn)
        with pytest.raises(TaskIDConflictError):
            await broker.enqueue(params("taken"), connection=c.conn)
        await c.commit()
    assert await pending(broker) == ["mine", "taken"]


async def test_E8_through_the_app_and_the_sync_face(broker: FullBroker, broker_url: str) -> None:
    app = durq.App(broker_url)
    try:
        async with caller(broker) as c:
            await app.enqueue("order:check", {"n": 1}, task_id="a-1", connection=c.conn)
            await c.rollback()
            await app.enqueue("order:check", {"n": 2}, task_id="a-2", connection=c.conn)
            await c.commit()
        assert await pending(broker) == ["a-2"]
        with sync_caller(broker) as conn:
            app.enqueue_sync("order:check", {"n": 3}, task_id="s-1", connection=conn)
            conn.rollback()
            app.enqueue_sync("order:check", {"n": 4}, task_id="s-2", connection=conn)
            conn.commit()
        assert await pending(broker) == ["a-2", "s-2"]
    finally:
        await app.close()


async def test_E8_sync_face_takes_the_options_of_enqueue(
    broker: FullBroker, broker_url: str
) -> None:
    """``enqueue_sync(..., connection=)`` accepts ``webhook=`` and ``then=`` like ``enqueue``:
    the task is written in the caller's transaction with both headers."""
    app = durq.App(broker_url)
    try:
        with sync_caller(broker) as conn:
            info = app.enqueue_sync(
                "order:check",
                {"n": 5},
                task_id="w-1",
                connection=conn,
                webhook="https://hooks.example.com/durq",
                then="order:checked",
            )
            conn.commit()
        assert info.headers[webhooks.HEADER_URL] == "https://hooks.example.com/durq"
        assert continuations.spec_of(info.headers) == continuations.spec_of(
            (await broker.admin.get_task("default", "w-1")).headers
        )
        assert (await broker.admin.get_task("default", "w-1")).headers == info.headers
    finally:
        await app.close()


@contextlib.contextmanager
def sync_caller(broker: FullBroker) -> Iterator[Any]:
    if broker.name == "sqlite":
        conn = sqlite3.connect(broker.path)  # type: ignore[attr-defined]
    else:
        import psycopg

        conn = psycopg.connect(caller_dsn(broker), prepare_threshold=None)
    try:
        yield conn
    finally:
        conn.close()


async def test_E8_sqlite_refuses_another_file_or_no_transaction(
    broker: FullBroker, tmp_path: Path
) -> None:
    if broker.name != "sqlite":
        pytest.skip("SQLite-specific checks of the caller's connection")
    other = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(ConfigurationError, match="broker's file"):
        await broker.enqueue(params("x"), connection=other)
    other.close()
    memory = sqlite3.connect(":memory:")
    with pytest.raises(ConfigurationError, match="in-memory"):
        await broker.enqueue(params("x"), connection=memory)
    autocommit = sqlite3.connect(broker.path, isolation_level=None)  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="autocommit"):
        await broker.enqueue(params("x"), connection=autocommit)
    autocommit.execute("BEGIN")  # an explicit transaction is fine
    await broker.enqueue(params("x"), connection=autocommit)
    autocommit.execute("COMMIT")
    with pytest.raises(ConfigurationError, match=r"sqlite3\.Connection"):
        await broker.enqueue(params("y"), connection=object())
    assert await pending(broker) == ["x"]
    # A file without the durq tables: a clear SchemaError, no attempt to migrate (that would
    # wait for the write lock the caller may hold).
    bare = sqlite3.connect(tmp_path / "bare.db")
    broker_on_bare = type(broker)(str(tmp_path / "bare.db"))
    with pytest.raises(SchemaError, match="durq migrate"):
        broker_on_bare.enqueue_sync_in(params("z"), bare)  # type: ignore[attr-defined]
    bare.close()


async def test_E8_sqlite_waiters_notice_the_commit(broker: FullBroker, make_broker: Any) -> None:
    if broker.name != "sqlite":
        pytest.skip("PostgreSQL notifies on commit; covered in tests/brokers/postgres")
    worker_side = await make_broker()
    assert await claim_ids(worker_side) == []
    conn = sqlite3.connect(broker.path)  # type: ignore[attr-defined]
    try:
        await broker.enqueue(params("late"), connection=conn)
        waiter = asyncio.create_task(worker_side.wait_for_work(["default"], 5.0))
        await asyncio.sleep(0.1)
        conn.commit()
        started = asyncio.get_running_loop().time()
        assert await waiter
        assert asyncio.get_running_loop().time() - started < 1.0
    finally:
        conn.close()
    assert await claim_ids(worker_side) == ["late"]


def _mark(c: Caller) -> str:
    return "?" if c.broker.name == "sqlite" else "%s"
