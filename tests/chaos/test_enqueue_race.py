"""200 concurrent enqueues of one task id, or of one unique task, create exactly one task
(E3, E4) on every broker: the refusal is decided by the storage, not by a read-then-write."""

from __future__ import annotations

import asyncio

import pytest

import durq
from durq.errors import DuplicateTaskError, TaskIDConflictError

CALLERS = 200
CLIENTS = 8  # separate apps: separate connections and pools racing each other


async def race(broker_url: str, **options: object) -> list[object]:
    setup = durq.App(broker_url)
    migrator = setup.new_broker()
    await migrator.migrate()
    await migrator.close()
    apps = [durq.App(broker_url) for _ in range(CLIENTS)]
    try:
        for app in apps:
            await app.broker()  # connected before the race starts
        gate = asyncio.Event()

        async def one(i: int) -> object:
            await gate.wait()
            try:
                return await apps[i % CLIENTS].enqueue(
                    "race:task", {"same": True}, queue="race", **options
                )
            except (TaskIDConflictError, DuplicateTaskError) as exc:
                return exc

        callers = [asyncio.create_task(one(i)) for i in range(CALLERS)]
        await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*callers)
    finally:
        for app in apps:
            await app.close()
        await setup.close()


async def queued(broker_url: str) -> int:
    app = durq.App(broker_url)
    try:
        stats = await app.inspector.queue_stats("race")
        return stats.size
    finally:
        await app.close()


@pytest.mark.timeout(60)
async def test_same_task_id_creates_one_task(broker_url: str) -> None:
    results = await race(broker_url, task_id="order-1")
    created = [r for r in results if isinstance(r, durq.TaskInfo)]
    refused = [r for r in results if isinstance(r, TaskIDConflictError)]
    assert len(created) == 1 and len(refused) == CALLERS - 1, results[:3]
    assert all(r.existing is None or r.existing.id == "order-1" for r in refused)
    assert await queued(broker_url) == 1


@pytest.mark.timeout(60)
async def test_same_unique_key_creates_one_task(broker_url: str) -> None:
    results = await race(broker_url, unique=3600)
    created = [r for r in results if isinstance(r, durq.TaskInfo)]
    refused = [r for r in results if isinstance(r, DuplicateTaskError)]
    assert len(created) == 1 and len(refused) == CALLERS - 1, results[:3]
    assert {r.existing_id for r in refused} <= {created[0].id, None}
    assert await queued(broker_url) == 1
