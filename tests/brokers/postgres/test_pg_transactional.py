"""E8: enqueue inside the caller's transaction, on async and sync psycopg connections."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from durq.brokers.base import EnqueueParams
from durq.brokers.postgres import PostgresBroker
from durq.errors import (
    ConfigurationError,
    QueueNotFoundError,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.states import TaskState
from servers import PG_DSN


def task(task_id: str, **options: object) -> EnqueueParams:
    return EnqueueParams(
        id=task_id,
        queue="default",
        type="insurance:check_coverage",
        payload=json.dumps({"order": task_id}).encode(),
        **options,  # type: ignore[arg-type]
    )


async def ids(pg: PostgresBroker) -> list[str]:
    """Pending task ids, sorted ([] also when the queue itself was rolled back)."""
    try:
        return sorted(t.id for t in await pg.admin.list_tasks("default", TaskState.PENDING))
    except QueueNotFoundError:
        return []


async def test_E8_async_commit_makes_the_task_visible(pg: PostgresBroker) -> None:
    async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
        info = await pg.enqueue(task("o-1"), connection=conn)
        assert info.state is TaskState.PENDING
        # Not committed yet: other connections do not see it.
        with pytest.raises(TaskNotFoundError):
            await pg.admin.get_task("default", "o-1")
        await conn.commit()
    assert (await pg.admin.get_task("default", "o-1")).id == "o-1"


async def test_E8_async_rollback_leaves_nothing(pg: PostgresBroker) -> None:
    async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
        await pg.enqueue(task("o-2"), connection=conn)
        await pg.enqueue_many([task("o-3"), task("o-4")], connection=conn)
        await conn.rollback()
    assert await ids(pg) == []
    # The ids are free again.
    assert (await pg.enqueue(task("o-2"))).id == "o-2"


async def test_E8_async_inside_a_transaction_block(pg: PostgresBroker) -> None:
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await pg.enqueue(task("o-5"), connection=conn)
                raise RuntimeError("the business write failed")
        async with conn.transaction():
            await pg.enqueue(task("o-6"), connection=conn)
    assert await ids(pg) == ["o-6"]


async def test_E8_conflict_inside_the_callers_transaction_keeps_it_usable(
    pg: PostgresBroker,
) -> None:
    await pg.enqueue(task("dup"))
    async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
        with pytest.raises(TaskIDConflictError) as caught:
            await pg.enqueue(task("dup"), connection=conn)
        assert caught.value.existing is not None and caught.value.existing.id == "dup"
        # ON CONFLICT DO NOTHING: no error inside the transaction, it can go on and commit.
        await pg.enqueue(task("after"), connection=conn)
        await conn.commit()
    assert await ids(pg) == ["after", "dup"]


def test_E8_sync_connection_commit_and_rollback(pg: PostgresBroker) -> None:
    with psycopg.connect(PG_DSN) as conn:
        pg.enqueue_sync_in(task("s-1"), conn)
        conn.rollback()
        info = pg.enqueue_sync_in(task("s-2"), conn)
        outcomes = pg.enqueue_many_sync_in([task("s-3"), task("s-2")], conn)
        conn.commit()
    assert info.id == "s-2"
    assert [o.created for o in outcomes] == [True, False]
    assert isinstance(outcomes[1].error, TaskIDConflictError)
    assert asyncio.run(_pending(pg)) == ["s-2", "s-3"]


async def _pending(pg: PostgresBroker) -> list[str]:
    fresh = PostgresBroker.from_url(f"{PG_DSN}?schema={pg.schema}")
    try:
        return sorted(t.id for t in await fresh.admin.list_tasks("default", TaskState.PENDING))
    finally:
        await fresh.close()


async def test_E8_sync_connection_through_the_async_method(pg: PostgresBroker) -> None:
    with psycopg.connect(PG_DSN) as conn:
        await pg.enqueue(task("s-4"), connection=conn)
        conn.commit()
    assert await ids(pg) == ["s-4"]


async def test_E8_notification_waits_for_commit(make_pg) -> None:
    waiter, client = await make_pg(), await make_pg()
    assert await waiter.wait_for_work(["default"], timeout=2)  # starts listening
    async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
        await client.enqueue(task("n-1"), connection=conn)
        wait = asyncio.create_task(waiter.wait_for_work(["default"], timeout=5))
        await asyncio.sleep(0.2)
        assert not wait.done()  # NOTIFY is delivered at commit, not before
        await conn.commit()
        assert await asyncio.wait_for(wait, 2)


async def test_E8_other_connection_types_are_refused(pg: PostgresBroker) -> None:
    with pytest.raises(ConfigurationError):
        await pg.enqueue(task("x"), connection=object())
