"""Schedules kept in the broker, on every broker: the API, and the scheduler ticking them
(exactly once across schedulers, pause, edits, overlap policies, DST) with the fake clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

import durq
from apptools import START, AppFactory
from durq.brokers.base import ClaimParams, CompleteParams
from durq.clock import FakeClock
from durq.errors import ScheduleConflictError, ScheduleNotFoundError, ValidationError
from durq.schedules import MAX_BACKFILL
from durq.states import TaskState
from durq.worker.periodic import PeriodicScheduler

T0 = int(START)  # a whole hour: 60 s ticks fall on it


async def ids_in(app: durq.App, state: TaskState = TaskState.PENDING) -> list[str]:
    try:
        tasks = await app.inspector.list_tasks("cron", state, limit=1000)
    except durq.errors.QueueNotFoundError:
        return []
    return sorted(t.id for t in tasks)


def ticks(name: str, *minutes: int) -> list[str]:
    return sorted(f"periodic:{name}:{T0 + 60 * m}" for m in minutes)


async def finish_all(app: durq.App) -> None:
    broker = await app.broker()
    for lease in await broker.claim(ClaimParams(["cron"], 100, "w1", 30)):
        assert await broker.complete(CompleteParams(lease.ref, None, 3600))


async def test_a_stored_schedule_ticks_once_with_two_schedulers(
    make_app: AppFactory, clock: FakeClock
) -> None:
    a, b = await make_app(), await make_app()
    await a.stored_schedules.add("job", "@every 60s", "job:run", queue="cron", payload={"k": 1})
    one = PeriodicScheduler(a, reload_interval=0)
    two = PeriodicScheduler(b, reload_interval=0)
    for step in range(9):  # four minutes in 30 s steps, both racing every step
        if step:
            clock.advance(30)
        await asyncio.gather(one.tick(), two.tick(), one.tick())
    assert await ids_in(a) == ticks("job", 0, 1, 2, 3, 4)
    assert one.enqueued + two.enqueued == 5
    info = await a.inspector.get_task_info("cron", f"periodic:job:{T0}")
    assert info.payload == {"k": 1} and info.type == "job:run"


async def test_pause_stops_ticks_and_resume_starts_at_the_next_one(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    await app.stored_schedules.add("job", "@every 60s", "job:run", queue="cron")
    scheduler = PeriodicScheduler(app, reload_interval=0)
    await scheduler.tick()
    paused = await app.stored_schedules.pause("job")
    assert paused.paused and paused.version == 2
    for _ in range(3):
        clock.advance(60)
        await scheduler.tick()
    assert await ids_in(app) == ticks("job", 0)
    await app.stored_schedules.resume("job")
    clock.advance(120)  # a tick missed while paused is not caught up
    await scheduler.tick()
    assert await ids_in(app) == ticks("job", 0, 5)


async def test_an_edit_reaches_a_running_scheduler_at_its_next_reload(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app, operator = await make_app(), await make_app()
    await operator.stored_schedules.add("job", "@every 60s", "job:run", queue="cron")
    scheduler = PeriodicScheduler(app, reload_interval=30)
    await scheduler.tick()
    await operator.stored_schedules.update("job", payload={"v": 2}, schedule="@every 120s")
    clock.advance(120)
    await scheduler.tick()  # reloads: 120 s passed since the last read
    info = await app.inspector.get_task_info("cron", f"periodic:job:{T0 + 120}")
    assert info.payload == {"v": 2}
    clock.advance(60)  # no tick at +180 under the new schedule
    await scheduler.tick()
    assert await ids_in(app) == ticks("job", 0, 2)
    await operator.stored_schedules.remove("job")
    clock.advance(60)
    await scheduler.tick()
    assert await ids_in(app) == ticks("job", 0, 2)  # deleted: no tick at +240


async def test_overlap_skip_drops_ticks_while_the_previous_run_is_unfinished(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    await app.stored_schedules.add("job", "@every 60s", "job:run", queue="cron", overlap="skip")
    scheduler = PeriodicScheduler(app, reload_interval=0)
    await scheduler.tick()
    clock.advance(60)
    assert await scheduler.check(scheduler.stored[0], clock.now()) == "overlap"
    clock.advance(60)
    await scheduler.tick()
    assert await ids_in(app) == ticks("job", 0)
    await finish_all(app)
    clock.advance(60)
    await scheduler.tick()
    assert await ids_in(app) == ticks("job", 3)


async def test_overlap_buffer_one_keeps_one_tick_until_the_previous_run_ends(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    await app.stored_schedules.add(
        "job", "@every 300s", "job:run", queue="cron", overlap="buffer_one"
    )
    scheduler = PeriodicScheduler(app, reload_interval=0)
    await scheduler.tick()
    for _ in range(2):  # ticks +300, +600 come while run 0 is unfinished: the latest waits
        clock.advance(300)
        assert await scheduler.check(scheduler.stored[0], clock.now()) == "buffered"
    assert await ids_in(app) == [f"periodic:job:{T0}"]
    await finish_all(app)
    clock.advance(90)  # older than the tolerance (60 s) by now: a buffered run still goes
    await scheduler.tick()
    assert await ids_in(app) == [f"periodic:job:{T0 + 600}"]
    assert await ids_in(app, TaskState.COMPLETED) == [f"periodic:job:{T0}"]


async def test_overlap_cancel_other_cancels_the_unfinished_run(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    await app.stored_schedules.add(
        "job", "@every 60s", "job:run", queue="cron", overlap="cancel_other"
    )
    scheduler = PeriodicScheduler(app, reload_interval=0)
    await scheduler.tick()
    clock.advance(60)
    await scheduler.tick()
    assert await ids_in(app) == ticks("job", 1)
    cancelled = await app.inspector.get_task_info("cron", f"periodic:job:{T0}")
    assert cancelled.state is TaskState.ARCHIVED


async def test_overlap_allow_is_the_default(make_app: AppFactory, clock: FakeClock) -> None:
    app = await make_app()
    entry = await app.stored_schedules.add("job", "@every 60s", "job:run", queue="cron")
    assert entry.overlap == "allow" and entry.source == "stored"
    scheduler = PeriodicScheduler(app, reload_interval=0)
    await scheduler.tick()
    clock.advance(60)
    await scheduler.tick()
    assert await ids_in(app) == ticks("job", 0, 1)


async def test_code_entries_are_read_only_and_win_on_a_shared_name(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    app.add_periodic("@every 60s", "job:code", queue="cron")
    with pytest.raises(ScheduleConflictError, match="declared in code"):
        await app.stored_schedules.add("job:code", "@hourly", "job:run")
    for action in (app.stored_schedules.pause, app.stored_schedules.remove):
        with pytest.raises(ScheduleConflictError):
            await action("job:code")
    await app.stored_schedules.add("job", "@every 60s", "job:run", queue="cron")
    with pytest.raises(ScheduleConflictError, match="stored already"):
        await app.stored_schedules.add("job", "@hourly", "job:run")
    listed = await app.stored_schedules.list()
    assert [(e.name, e.source) for e in listed] == [("job:code", "code"), ("job", "stored")]
    # A deploy that declares a stored name in code: the code entry wins, the record idles.
    other = await make_app()
    other.add_periodic("@every 120s", "job:other", name="job", queue="cron")
    scheduler = PeriodicScheduler(other, reload_interval=0)
    clock.advance(60)
    await scheduler.tick()
    (tick,) = await ids_in(other)
    assert (await other.inspector.get_task_info("cron", tick)).type == "job:other"
    with pytest.raises(ScheduleNotFoundError):
        await app.stored_schedules.resume("nothing")
    with pytest.raises(ScheduleNotFoundError):
        await app.stored_schedules.get("nothing")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"schedule": "61 * * * *"}, "cron"),
        ({"tz": "Mars/Olympus"}, "time zone"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"payload": [1]}, "JSON object"),
        ({"type": "durq:webhook"}, "reserved|durq:"),
        ({"schedule": "0 0 31 2 *"}, "never ticks"),  # February 31st
    ],
)
async def test_bad_input_is_a_validation_error(
    make_app: AppFactory, options: dict[str, object], match: str
) -> None:
    app = await make_app()
    fields: dict[str, object] = {"schedule": "@hourly", "type": "job:run", **options}
    with pytest.raises(ValidationError, match=match):
        await app.stored_schedules.add("job", **fields)  # type: ignore[arg-type]
    assert await app.stored_schedules.list() == []


async def test_trigger_enqueues_a_run_now_with_its_own_id(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    await app.stored_schedules.add("job", "@daily", "job:run", queue="cron", payload={"a": 1})
    await app.stored_schedules.pause("job")  # a paused schedule can still be run by hand
    first = await app.stored_schedules.trigger("job")
    second = await app.stored_schedules.trigger("job")
    assert first.id != second.id
    assert first.id.startswith(f"periodic:job:run:{T0}-")
    assert first.payload == {"a": 1} and first.state is TaskState.PENDING


async def test_backfill_enqueues_each_tick_of_the_range_once(
    make_app: AppFactory, clock: FakeClock
) -> None:
    app = await make_app()
    await app.stored_schedules.add("job", "@every 60s", "job:run", queue="cron")
    start, end = datetime.fromtimestamp(T0 - 300, UTC), datetime.fromtimestamp(T0, UTC)
    dry = await app.stored_schedules.backfill("job", start, end, dry_run=True)
    assert dry.ticks == [float(T0 + 60 * m) for m in range(-5, 1)] and dry.enqueued == []
    assert await ids_in(app) == []
    done = await app.stored_schedules.backfill("job", start.isoformat(), end.isoformat())
    assert sorted(done.enqueued) == ticks("job", -5, -4, -3, -2, -1, 0)
    again = await app.stored_schedules.backfill("job", start, end)
    assert again.enqueued == [] and len(again.existing) == 6
    with pytest.raises(ValidationError, match=str(MAX_BACKFILL)):
        await app.stored_schedules.backfill("job", T0 - 60 * MAX_BACKFILL, T0)
    with pytest.raises(ValidationError, match="start"):
        await app.stored_schedules.backfill("job", end, start)


async def test_a_stored_cron_follows_dst_as_code_entries_do(make_app: AppFactory) -> None:
    app = await make_app()
    await app.stored_schedules.add("night", "30 2 * * *", "job:run", tz="Europe/Berlin")
    # 2026-03-29: clocks go 02:00 -> 03:00 in Berlin; 2026-10-25: 03:00 -> 02:00.
    spring = await app.stored_schedules.backfill(
        "night", "2026-03-28T12:00:00+00:00", "2026-03-30T12:00:00+00:00", dry_run=True
    )
    assert [datetime.fromtimestamp(t, UTC).isoformat() for t in spring.ticks] == [
        "2026-03-29T01:00:00+00:00",  # 03:00 CEST, right after the gap
        "2026-03-30T00:30:00+00:00",
    ]
    autumn = await app.stored_schedules.backfill(
        "night", "2026-10-24T12:00:00+00:00", "2026-10-25T12:00:00+00:00", dry_run=True
    )
    assert [datetime.fromtimestamp(t, UTC).isoformat() for t in autumn.ticks] == [
        "2026-10-25T00:30:00+00:00"  # once, in the first 02:30 (CEST)
    ]
