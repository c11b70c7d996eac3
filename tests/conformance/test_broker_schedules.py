"""Stored periodic schedules through the Admin protocol: create, fenced update, list, delete."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from durq.brokers import FullBroker
from durq.brokers.base import ScheduleRecord
from durq.clock import FakeClock

RECORD = ScheduleRecord(
    name="report:eu",
    spec="*/5 * * * *",
    type="report:build",
    payload='{"region": "eu", "tags": []}',
    queue="reports",
    tz="Europe/Berlin",
    overlap="skip",
)


async def test_create_stores_version_one_with_the_broker_time(
    broker: FullBroker, clock: FakeClock
) -> None:
    stored = await broker.admin.put_schedule(RECORD)
    assert stored == replace(RECORD, version=1, updated_at=stored.updated_at if stored else 0)
    assert stored is not None and abs(stored.updated_at - clock.now()) < 5
    assert await broker.admin.get_schedule("report:eu") == stored
    assert await broker.admin.list_schedules() == [stored]


async def test_create_is_refused_when_the_name_exists(broker: FullBroker) -> None:
    assert await broker.admin.put_schedule(RECORD) is not None
    assert await broker.admin.put_schedule(replace(RECORD, spec="@daily")) is None
    stored = await broker.admin.get_schedule("report:eu")
    assert stored is not None and stored.spec == "*/5 * * * *"


async def test_update_is_fenced_by_the_version_read(broker: FullBroker, clock: FakeClock) -> None:
    first = await broker.admin.put_schedule(RECORD)
    assert first is not None
    clock.advance(10)
    second = await broker.admin.put_schedule(replace(first, paused=True, queue=None))
    assert second is not None
    assert (second.version, second.paused, second.queue) == (2, True, None)
    assert second.updated_at > first.updated_at
    # A writer that read version 1 loses: nothing changes.
    assert await broker.admin.put_schedule(replace(first, spec="@hourly")) is None
    assert await broker.admin.get_schedule("report:eu") == second
    # An update of a schedule that is not stored (deleted meanwhile) changes nothing either.
    assert await broker.admin.put_schedule(replace(RECORD, name="other", version=3)) is None
    assert await broker.admin.get_schedule("other") is None


async def test_concurrent_updates_of_one_version_store_exactly_one(broker: FullBroker) -> None:
    first = await broker.admin.put_schedule(RECORD)
    assert first is not None
    edits = [replace(first, spec=f"{minute} * * * *") for minute in range(8)]
    results = await asyncio.gather(*(broker.admin.put_schedule(e) for e in edits))
    won = [r for r in results if r is not None]
    assert len(won) == 1 and won[0].version == 2
    assert await broker.admin.get_schedule("report:eu") == won[0]


async def test_list_is_by_name_and_delete_says_whether_there_was_one(broker: FullBroker) -> None:
    assert await broker.admin.list_schedules() == []
    for name in ("b", "a", "c"):
        assert await broker.admin.put_schedule(replace(RECORD, name=name)) is not None
    assert [r.name for r in await broker.admin.list_schedules()] == ["a", "b", "c"]
    assert await broker.admin.delete_schedule("b") is True
    assert await broker.admin.delete_schedule("b") is False
    assert await broker.admin.get_schedule("b") is None
    assert [r.name for r in await broker.admin.list_schedules()] == ["a", "c"]
    # A deleted name can be created again, from version 1.
    again = await broker.admin.put_schedule(replace(RECORD, name="b"))
    assert again is not None and again.version == 1
