"""Concurrent requests' orders share one transaction (``store.group_commit``), and each
request keeps the answer it would have had alone: on SQLite (orders in the broker's file, or
apart) and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from examples.insurance.config import Settings
from examples.insurance.store import NewOrder, OrderStore, open_store
from examples.insurance.tasks import COVERAGE_QUEUE, build, enqueue_coverage

import durq
from durq.web import Answer
from servers import PG_DSN, broker_url_for, drop_isolated, require_server, unique_name


def new_order(i: int, key: str | None = None) -> NewOrder:
    order_id = f"ord_{i:024x}"
    return NewOrder(
        id=order_id,
        customer="alice",
        idempotency_key=key if key is not None else f"key-{i}",
        request_hash=f"h{i}",
        items=[{"sku": "A-1", "qty": 1}],
        task_id=f"coverage:{order_id}",
    )


class Counting:
    """``enqueue_coverage`` of ``app`` that remembers the size of every call."""

    def __init__(self, app: durq.App) -> None:
        self.app = app
        self.calls: list[int] = []

    async def __call__(self, orders: Sequence[NewOrder], connection: Any) -> list[Answer]:
        self.calls.append(len(orders))
        return await enqueue_coverage(self.app, orders, connection)


async def store_and_app(settings: Settings) -> tuple[OrderStore, durq.App]:
    app, _ = build(settings)
    broker = app.new_broker()
    try:
        await broker.migrate()  # as `durq migrate` does before a deploy
    finally:
        await broker.close()
    transactional = settings.database_url.startswith("postgresql") or (
        settings.database_url == settings.broker_url
    )
    store = open_store(
        settings.database_url,
        settings.database_schema,
        transactional=transactional,
        broker_url=settings.broker_url,
    )
    await store.open()
    return store, app


@pytest.fixture(params=["sqlite-one-file", "sqlite-apart", "postgres"])
async def store(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path
) -> AsyncIterator[tuple[OrderStore, durq.App]]:
    cleanup: list[str] = []
    if request.param == "sqlite-apart":
        settings = settings.with_(database_url=f"sqlite:///{tmp_path / 'orders.sqlite3'}")
    elif request.param == "postgres":
        require_server("postgres")
        pytest.importorskip("durq.brokers.postgres", reason="no PostgreSQL broker")
        broker_url = broker_url_for("postgres", tmp_path)
        schema = unique_name("insurance_test")
        settings = settings.with_(
            broker_url=broker_url, database_url=PG_DSN, database_schema=schema
        )
        cleanup = [broker_url, f"{PG_DSN}?schema={schema}"]
    store, app = await store_and_app(settings)
    try:
        yield store, app
    finally:
        await store.close()
        await app.close()
        for url in cleanup:
            drop_isolated("postgres", url)


async def task_ids(app: durq.App) -> set[str]:
    tasks = await app.inspector.list_tasks(COVERAGE_QUEUE, durq.TaskState.PENDING, limit=1000)
    return {t.id for t in tasks}


async def test_concurrent_orders_share_transactions_and_keep_their_answers(
    store: tuple[OrderStore, durq.App],
) -> None:
    orders_store, app = store
    enqueue = Counting(app)
    orders = [new_order(i) for i in range(40)]
    # The first ten again, with the same keys (a client retrying at once).
    again = orders[:10]
    created = await asyncio.gather(*(orders_store.create(o, enqueue) for o in orders + again))
    first, second = created[:40], created[40:]
    assert all(c.answer is not None and c.answer.status_code == 202 for c in first)
    for order, c in zip(again, second, strict=True):
        assert c.answer is None and c.existing is not None and c.existing.id == order.id
    assert await orders_store.count() == 40
    assert await task_ids(app) == {o.task_id for o in orders}
    # Fewer transactions than orders: the ones that waited went together.
    assert len(enqueue.calls) < 40 and max(enqueue.calls) > 1


async def test_a_refused_order_in_a_batch_is_not_saved_and_the_others_are(
    store: tuple[OrderStore, durq.App],
) -> None:
    orders_store, app = store
    orders = [new_order(i) for i in range(20)]
    # A task with the id of order 7's task exists already (no order): order 7's enqueue is
    # refused (200 already accepted), so order 7 must not stay saved without its own task.
    await app.enqueue("insurance:check_coverage", {"order_id": "x"}, task_id=orders[7].task_id)
    enqueue = Counting(app)
    created = await asyncio.gather(*(orders_store.create(o, enqueue) for o in orders))
    statuses = [c.answer.status_code if c.answer else None for c in created]
    assert statuses == [200 if i == 7 else 202 for i in range(20)]
    if orders_store.transactional:
        # Its transaction wrote no task for it: its order is not kept either.
        assert await orders_store.count() == 19
        assert await orders_store.get(orders[7].id) is None
    else:
        # Saved first, then enqueued: a task with its id exists, so it stays (as a retry
        # that heals a lost enqueue finds it).
        assert await orders_store.count() == 20
    assert max(enqueue.calls) > 1


async def test_a_batch_that_fails_as_a_whole_is_retried_order_by_order(
    store: tuple[OrderStore, durq.App],
) -> None:
    orders_store, app = store
    orders = [new_order(i) for i in range(12)]
    calls: list[int] = []

    async def fails_with_order_3(seq: Sequence[NewOrder], connection: Any) -> list[Answer]:
        calls.append(len(seq))
        if any(o.id == orders[3].id for o in seq):
            raise RuntimeError("order 3 breaks whatever batch it is in")
        return await enqueue_coverage(app, seq, connection)

    results = await asyncio.gather(
        *(orders_store.create(o, fails_with_order_3) for o in orders), return_exceptions=True
    )
    assert isinstance(results[3], RuntimeError)
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 3)
    assert await orders_store.count() == 11
    assert await orders_store.get(orders[3].id) is None
    assert await task_ids(app) == {o.task_id for i, o in enumerate(orders) if i != 3}


async def test_orders_with_different_enqueue_steps_never_share_a_transaction(
    store: tuple[OrderStore, durq.App],
) -> None:
    orders_store, app = store
    one, other = Counting(app), Counting(app)
    orders = [new_order(i) for i in range(12)]
    created = await asyncio.gather(
        *(orders_store.create(o, one if i % 2 else other) for i, o in enumerate(orders))
    )
    assert all(c.answer is not None and c.answer.status_code == 202 for c in created)
    assert sum(one.calls) == sum(other.calls) == 6
    assert await task_ids(app) == {o.task_id for o in orders}
