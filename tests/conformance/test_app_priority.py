"""Task priority through the App on every broker (W8): the enqueue options, the task's
default, bulk and sync enqueue, the bounds, and a worker running higher priorities first."""

from __future__ import annotations

import asyncio

import pytest

import durq
from conformance.apps import FAST, wait_for_state
from durq.brokers import open_broker
from durq.options import MAX_PRIORITY, MIN_PRIORITY
from durq.states import TaskState


async def test_priority_from_enqueue_the_task_default_and_bulk(app: durq.App) -> None:
    @app.task("report:urgent", priority=40)
    async def urgent(payload: dict[str, int]) -> None: ...

    assert (await app.enqueue("email:send", {})).priority == 0
    assert (await app.enqueue("email:send", {}, priority=-9)).priority == -9
    assert (await urgent.enqueue({})).priority == 40  # the task's default
    assert (await urgent.enqueue({}, priority=MIN_PRIORITY)).priority == MIN_PRIORITY
    outcomes = await app.enqueue_many(
        [
            durq.EnqueueRequest("email:send", {}, priority=MAX_PRIORITY),
            urgent.request({}),
            durq.EnqueueRequest("email:send", {}),
        ]
    )
    assert [o.info.priority for o in outcomes if o.info] == [MAX_PRIORITY, 40, 0]
    stored = await app.inspector.get_task_info("default", outcomes[0].params.id)
    assert stored.priority == MAX_PRIORITY


@pytest.mark.parametrize("bad", [MAX_PRIORITY + 1, MIN_PRIORITY - 1, 10**30, True, 1.5, "5"])
async def test_a_priority_out_of_range_is_refused(app: durq.App, bad: object) -> None:
    message = "priority must be an integer from -100 to 100"
    with pytest.raises(durq.InvalidPriorityError, match=message):
        await app.enqueue("email:send", {}, priority=bad)  # type: ignore[arg-type]
    with pytest.raises(durq.InvalidPriorityError, match=message):
        await app.enqueue_many([durq.EnqueueRequest("email:send", {}, priority=bad)])  # type: ignore[arg-type]
    with pytest.raises(durq.InvalidPriorityError, match=message):
        app.task("bad:default", priority=bad)  # type: ignore[arg-type]
    assert all(q.size == 0 for q in await app.inspector.list_queues())


def test_the_sync_face_takes_a_priority(broker_url: str) -> None:
    app = durq.App(broker_url)
    migrator = open_broker(broker_url)
    asyncio.run(migrator.migrate())
    try:
        info = app.enqueue_sync("email:send", {}, task_id="sync-p", priority=12)
        assert info.priority == 12
        seen = app.run_sync(lambda: app.inspector.get_task_info("default", "sync-p"))
        assert seen.priority == 12
    finally:
        app.close_sync()
        asyncio.run(migrator.close())


async def test_a_worker_runs_higher_priorities_first(app: durq.App) -> None:
    ran: list[str] = []
    done = asyncio.Event()

    @app.task("job:record")
    async def record(payload: dict[str, str]) -> None:
        ran.append(payload["name"])
        if len(ran) == 4:
            done.set()

    # Enqueued before any worker runs, lowest first: only the claim can put them in order.
    for name, priority in [("low", -50), ("plain", 0), ("urgent", 90), ("high", 10)]:
        await record.enqueue({"name": name}, priority=priority)
    worker = app.worker(queues=["default"], concurrency=1, scheduler=False)
    async with worker:
        await asyncio.wait_for(done.wait(), 30)
    assert ran == ["urgent", "high", "plain", "low"]


async def test_a_follow_up_gets_its_type_s_priority_or_then_s(app: durq.App) -> None:
    @app.task("pdf:render")
    async def render(payload: dict[str, int]) -> None: ...

    @app.task("mail:urgent", priority=30, retention=60)
    async def urgent(payload: dict[str, object]) -> None: ...

    with pytest.raises(durq.InvalidPriorityError, match=r"Then\.priority"):
        await render.enqueue({}, then=durq.Then("mail:urgent", priority=500))
    by_type = await render.enqueue({}, then="mail:urgent")
    by_then = await render.enqueue({}, then=durq.Then("mail:urgent", priority=-5))
    async with app.worker(queues=["default"], **FAST):
        for parent in (by_type, by_then):
            follow_id = f"then:{parent.id}"
            await wait_for_state(app, "default", follow_id, TaskState.COMPLETED)
    assert (await app.inspector.get_task_info("default", f"then:{by_type.id}")).priority == 30
    assert (await app.inspector.get_task_info("default", f"then:{by_then.id}")).priority == -5
