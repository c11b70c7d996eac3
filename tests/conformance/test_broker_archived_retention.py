"""Archived retention: the janitor deletes archived tasks once their queue's archived
retention has passed since they were archived (worker, rescuer or inspector), in bounded
batches, per queue, and never touches other states or the groups they finished in."""

from __future__ import annotations

from brokerkit import C, P, R, S, X, claim, params, picture, put, snapshot

import durq
from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import ArchivedRetention, ArchiveParams
from durq.clock import FakeClock
from durq.options import DEFAULT_ARCHIVED_RETENTION, archived_policy
from durq.worker.maintenance import Janitor

HOUR = ArchivedRetention(3600.0)


async def test_archived_tasks_go_once_their_retention_has_passed(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"old": X, "done": C, "again": R}, retention=86400)
    clock.advance(1800)
    await put(broker, clock, {"young": X, "later": S, "now": P})
    await lifecycle.archive_task(broker.admin, "default", "now")  # by the inspector
    before = picture(archived="now old young", completed="done", retry="again", scheduled="later")
    assert await broker.delete_archived(HOUR, 100) == 0
    clock.advance(1799)
    assert await broker.delete_archived(HOUR, 100) == 0
    assert await snapshot(broker) == before
    clock.advance(1)
    assert await broker.delete_archived(HOUR, 100) == 1
    assert await snapshot(broker) == picture(
        archived="now young", completed="done", retry="again", scheduled="later"
    )
    clock.advance(1800)
    assert await broker.delete_archived(HOUR, 100) == 2
    assert await snapshot(broker) == picture(completed="done", retry="again", scheduled="later")


async def test_the_clock_restarts_when_a_task_is_archived_again(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"t": X})
    clock.advance(3000)
    await lifecycle.run_task(broker.admin, "default", "t")
    (lease,) = await claim(broker)
    assert await broker.archive(ArchiveParams(lease.ref, "again"))
    clock.advance(3000)
    assert await broker.delete_archived(HOUR, 100) == 0
    clock.advance(600)
    assert await broker.delete_archived(HOUR, 100) == 1


async def test_per_queue_retention_and_keep_forever(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"a": X}, queue="default")
    await put(broker, clock, {"b": X}, queue="payments")
    await put(broker, clock, {"c": X}, queue="reports")
    policy = archived_policy({"*": "1h", "payments": None, "reports": "2h"})
    clock.advance(3600)
    assert await broker.delete_archived(policy, 100) == 1
    assert await snapshot(broker, "default") == {}
    clock.advance(3600)
    assert await broker.delete_archived(policy, 100) == 1
    assert await snapshot(broker, "reports") == {}
    clock.advance(86400 * 365)
    assert await broker.delete_archived(policy, 100) == 0
    assert await snapshot(broker, "payments") == picture(archived="b")
    assert await broker.delete_archived(ArchivedRetention(None), 100) == 0


async def test_batches_are_bounded(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(5):
        await broker.enqueue(params(f"t{i}"))
    for lease in await claim(broker, limit=5):
        assert await broker.archive(ArchiveParams(lease.ref, "boom"))
    clock.advance(3600)
    assert [await broker.delete_archived(HOUR, 2) for _ in range(4)] == [2, 2, 1, 0]


async def test_the_apps_janitor_keeps_archived_tasks_a_week_by_default(
    broker: FullBroker, clock: FakeClock
) -> None:
    app = durq.App(broker, clock=clock)
    assert app.archived_retention == ArchivedRetention(DEFAULT_ARCHIVED_RETENTION)
    await put(broker, clock, {"x": X})
    janitor = Janitor(broker, 60, app.archived_retention)
    clock.advance(DEFAULT_ARCHIVED_RETENTION - 1)
    await janitor.tick()
    assert await snapshot(broker) == picture(archived="x")
    clock.advance(1)
    await janitor.tick()
    assert await snapshot(broker) == {}


async def test_a_group_is_unchanged_when_its_archived_member_goes(
    broker: FullBroker, clock: FakeClock
) -> None:
    app = durq.App(broker, clock=clock)
    group = await app.enqueue_group(
        [durq.EnqueueRequest(type="t:t", payload={"n": n}) for n in range(2)], then="t:merge"
    )
    first, _ = await claim(broker, limit=2)
    assert await broker.archive(lifecycle.gave_up(first, "boom", now=clock.now()))
    before = await app.inspector.get_group(group.queue, group.id)
    assert before.finished == 1
    clock.advance(3600)
    assert await broker.delete_archived(HOUR, 100) == 1
    after = await app.inspector.get_group(group.queue, group.id)
    assert (after.finished, after.finished_at) == (1, None)  # no second outcome, no follow-up
    assert [m.state for m in after.members] == [m.state for m in before.members]
