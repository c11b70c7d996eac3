"""The scheduler on every broker: each tick enqueued exactly once, whatever runs (P1, E3)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import durq
from apptools import START, AppFactory
from durq.brokers.base import ClaimParams, CompleteParams
from durq.clock import FakeClock
from durq.periodic import HEADER_ENTRY, HEADER_TICK, status
from durq.states import TaskState
from durq.worker.periodic import PeriodicScheduler


def declare(app: durq.App, **options: Any) -> None:
    app.add_periodic("@every 60s", "job:minutely", queue="cron", **options)
    app.add_periodic(
        "*/5 * * * *", "job:five", queue="cron", tz="Europe/Moscow", payload={"k": 1}, **options
    )


async def ids_in(app: durq.App, queue: str = "cron") -> list[str]:
    tasks = await app.inspector.list_tasks(queue, TaskState.PENDING, limit=1000)
    return sorted(t.id for t in tasks)


async def test_two_schedulers_enqueue_each_tick_once(
    make_app: AppFactory, clock: FakeClock
) -> None:
    a, b = await make_app(), await make_app()
    declare(a)
    declare(b)
    one, two = PeriodicScheduler(a), PeriodicScheduler(b)
    for step in range(25):  # 09:00:00 to 09:12:00 in 30 s steps, both racing every step
        if step:
            clock.advance(30)
        await asyncio.gather(one.tick(), two.tick(), one.tick())
    ids = await ids_in(a)
    assert len(ids) == len(set(ids))
    minutely = {f"periodic:job:minutely:{int(START) + 60 * m}" for m in range(13)}
    five = {f"periodic:job:five:{int(START) + 300 * m}" for m in range(3)}
    assert set(ids) == minutely | five
    assert one.enqueued + two.enqueued == len(ids) == 16
    info = await a.inspector.get_task_info("cron", f"periodic:job:five:{int(START)}")
    assert info.payload == {"k": 1} and info.type == "job:five"
    assert info.headers[HEADER_ENTRY] == "job:five"
    assert info.headers[HEADER_TICK] == str(int(START))


async def test_a_restarted_scheduler_does_not_repeat_a_tick(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    declare(app)
    clock.advance(30)
    assert await PeriodicScheduler(app).check(app.schedules.get("job:minutely"), clock.now()) == (
        "enqueued"
    )
    # A new process knows nothing: it tries the latest tick again and the broker says no.
    again = PeriodicScheduler(app)
    assert await again.check(app.schedules.get("job:minutely"), clock.now()) == "exists"
    assert len(await ids_in(app)) == 1


async def test_a_completed_tick_still_blocks_a_late_duplicate(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    app.add_periodic("@every 60s", "job:minutely", queue="cron", missed="run_once")
    entry = app.schedules.get("job:minutely")
    clock.advance(1)
    scheduler = PeriodicScheduler(app)
    await scheduler.tick()
    broker = await app.broker()
    leases = await broker.claim(ClaimParams(["cron"], 10, "w1", 30))
    assert len(leases) == 1 and leases[0].task.retention == entry.retention
    assert await broker.complete(CompleteParams(leases[0].ref, None, leases[0].task.retention))
    # Just before the next tick a run_once scheduler starting up tries this tick again.
    clock.advance(58)
    assert await PeriodicScheduler(app).check(entry, clock.now()) == "exists"
    done = await app.inspector.get_task_info("cron", leases[0].task.id)
    assert done.state is TaskState.COMPLETED


async def test_missed_ticks_skip_or_run_once(make_app: AppFactory, clock: FakeClock) -> None:
    app = await make_app()
    app.add_periodic("@every 60s", "job:skip", queue="cron", tolerance=10)
    app.add_periodic("@every 60s", "job:once", queue="cron", missed="run_once")
    scheduler = PeriodicScheduler(app)
    await scheduler.tick()  # 09:00:00: both on time
    assert len(await ids_in(app)) == 2
    # Everything was down for an hour and comes back 30 s after a tick.
    clock.advance(3600 + 30)
    restarted = PeriodicScheduler(app)
    await restarted.tick()
    ids = await ids_in(app)
    catch_up = f"periodic:job:once:{int(START + 3600)}"
    assert sorted(ids) == sorted(
        [f"periodic:job:skip:{int(START)}", f"periodic:job:once:{int(START)}", catch_up]
    )
    # Back to normal at the next tick.
    clock.advance(30)
    await restarted.tick()
    assert len(await ids_in(app)) == 5


async def test_run_once_does_not_catch_up_on_the_very_first_start(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    # Declared at 09:00: the 03:00 tick of today was not missed, the entry did not exist.
    app.add_periodic("0 3 * * *", "job:nightly", queue="cron", tz="UTC", missed="run_once")
    clock.advance(30)
    scheduler = PeriodicScheduler(app)
    entry = app.schedules.get("job:nightly")
    assert await scheduler.check(entry, clock.now()) == "skipped"
    await scheduler.tick()
    assert await status(app) and (await status(app))[0].last_task_id is None
    # Its first real tick, tomorrow at 03:00, is enqueued as usual.
    clock.advance(18 * 3600)
    await scheduler.tick()
    assert await ids_in(app) == [f"periodic:job:nightly:{int(START) + 18 * 3600}"]


async def test_clock_jumps(make_app: AppFactory, clock: FakeClock) -> None:
    app = await make_app()
    app.add_periodic("@every 60s", "job:minutely", queue="cron")
    scheduler = PeriodicScheduler(app)
    await scheduler.tick()
    clock.advance(120)
    await scheduler.tick()
    # The wall clock steps back five minutes (NTP): nothing is enqueued twice, nothing new
    # until time passes the last handled tick again.
    clock.advance(-300)
    await scheduler.tick()
    assert len(await ids_in(app)) == 2
    clock.advance(300 + 60)
    await scheduler.tick()
    assert len(await ids_in(app)) == 3
    # A jump forward of a day enqueues one tick, not 1440.
    clock.advance(86400)
    await scheduler.tick()
    assert len(await ids_in(app)) == 4


async def test_status_shows_next_run_and_last_enqueue(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    declare(app)
    clock.advance(5)
    await PeriodicScheduler(app).tick()
    rows = {row.entry.name: row for row in await status(app)}
    minutely = rows["job:minutely"]
    assert minutely.queue == "cron"
    assert minutely.next_run.timestamp() == START + 60
    assert minutely.last_task_id == f"periodic:job:minutely:{int(START)}"
    assert minutely.last_state == "pending" and minutely.last_enqueued_at is not None
    five = rows["job:five"]
    assert five.next_run.timestamp() == START + 300 and str(five.next_run.tzinfo) == "Europe/Moscow"
    assert five.last_task_id == f"periodic:job:five:{int(START)}"
    assert five.to_dict()["last_state"] == "pending"


async def test_two_workers_run_each_tick_once(make_app: AppFactory) -> None:
    """End to end, real clock: two workers, each with its scheduler, one run per tick."""
    runs: Counter[str] = Counter()
    apps = [await make_app(fake_clock=False) for _ in range(2)]
    for app in apps:

        @app.periodic("@every 1s", type="job:second", retention=60)
        async def second(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
            runs[ctx.headers[HEADER_TICK]] += 1

    fast = {"poll_interval": 0.1, "promote_interval": 0.1, "shutdown_timeout": 5.0}
    async with apps[0].worker(**fast), apps[1].worker(**fast):
        deadline = time.monotonic() + 10
        while len(runs) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert len(runs) >= 3
    assert set(runs.values()) == {1}, runs


async def test_worker_without_scheduler_enqueues_nothing(make_app: AppFactory) -> None:
    app = await make_app(fake_clock=False)

    @app.periodic("@every 1s", type="job:second")
    def second(payload: dict[str, Any]) -> None: ...

    async with app.worker(scheduler=False, poll_interval=0.1):
        await asyncio.sleep(1.2)
    assert await app.inspector.list_tasks("default", TaskState.PENDING) == []
    stats = await app.inspector.list_queues()
    assert all(q.processed_total == 0 for q in stats)


async def test_a_tick_refused_as_duplicate_does_not_stall_the_scheduler(
    make_app: AppFactory, clock: FakeClock
) -> None:
    # A task type registered with unique= refuses a tick while the last one is queued (E4):
    # that tick is handled (not retried every round), and later entries still run.
    app = await make_app()

    @app.task("job:deduped", queue="cron", unique=3600)
    async def deduped(payload: dict[str, Any]) -> None: ...

    app.add_periodic("@every 60s", "job:deduped", queue="cron")
    app.add_periodic("@every 60s", "job:minutely", queue="cron")
    scheduler = PeriodicScheduler(app)
    await scheduler.tick()
    clock.advance(60)
    await scheduler.tick()  # job:deduped's tick is a duplicate of the queued one
    assert await scheduler.check(app.schedules.get("job:deduped"), clock.now()) is None
    ids = await ids_in(app)
    assert [i for i in ids if i.startswith("periodic:job:minutely:")] == [
        f"periodic:job:minutely:{int(START)}",
        f"periodic:job:minutely:{int(START) + 60}",
    ]
