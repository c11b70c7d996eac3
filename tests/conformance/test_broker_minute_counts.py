"""Per-minute counters (what every dashboard draws its chart from): a completion adds one
processed, a retry or a counted archive one processed and one failed, in the minute of the
broker clock; read per queue or summed; dropped by the janitor after two days."""

from __future__ import annotations

from brokerkit import LATER, claim, params

from durq.brokers import FullBroker
from durq.brokers.base import (
    MINUTE_COUNTS_KEEP,
    ArchiveParams,
    CompleteParams,
    MinuteCounts,
    RetryParams,
)
from durq.clock import FakeClock


async def finish(broker: FullBroker, clock: FakeClock, task_id: str, how: str, queue: str) -> None:
    await broker.enqueue(params(task_id, queue))
    (lease,) = await claim(broker, queue)
    if how == "complete":
        assert await broker.complete(CompleteParams(lease.ref, b"1", 0))
    elif how == "complete_many":
        assert await broker.complete_many([CompleteParams(lease.ref, b"1", 0)]) == [True]
    elif how == "retry":
        assert await broker.retry(RetryParams(lease.ref, "boom", LATER))
    elif how == "archive":
        assert await broker.archive(ArchiveParams(lease.ref, "boom"))
    elif how == "archive_uncounted":
        assert await broker.archive(ArchiveParams(lease.ref, "gone", count_attempt=False))
    elif how == "move_leases":
        assert await broker.move_leases([ArchiveParams(lease.ref, "lost", lost=True)]) == [True]


async def test_counts_per_minute_per_queue_and_summed(broker: FullBroker, clock: FakeClock) -> None:
    start = clock.now()  # a whole minute
    await finish(broker, clock, "a", "complete", "default")
    clock.advance(30)  # same minute
    await finish(broker, clock, "b", "complete_many", "default")
    await finish(broker, clock, "c", "complete", "other")
    clock.advance(45)  # the next minute
    await finish(broker, clock, "d", "retry", "default")
    await finish(broker, clock, "e", "archive_uncounted", "default")
    clock.advance(3 * 60)  # a gap of two empty minutes
    await finish(broker, clock, "f", "archive", "default")
    await finish(broker, clock, "g", "move_leases", "other")

    m = int(start)
    assert await broker.admin.minute_counts("default", start) == [
        MinuteCounts(m, 2, 0),
        MinuteCounts(m + 60, 1, 1),
        MinuteCounts(m + 240, 1, 1),
    ]
    assert await broker.admin.minute_counts(None, start) == [
        MinuteCounts(m, 3, 0),
        MinuteCounts(m + 60, 1, 1),
        MinuteCounts(m + 240, 2, 2),
    ]
    # From the minute of `since` on: 61 s in is the second minute.
    assert await broker.admin.minute_counts("other", start + 61) == [MinuteCounts(m + 240, 1, 1)]
    assert await broker.admin.minute_counts("nowhere", start) == []


async def test_the_janitor_drops_minutes_older_than_the_keep(
    broker: FullBroker, clock: FakeClock
) -> None:
    start = clock.now()
    await finish(broker, clock, "a", "complete", "default")
    clock.advance(MINUTE_COUNTS_KEEP - 60)
    await finish(broker, clock, "b", "complete", "default")
    await broker.delete_expired(100)
    assert [c.processed for c in await broker.admin.minute_counts(None, start)] == [1, 1]
    clock.advance(120)
    await broker.delete_expired(100)
    assert await broker.admin.minute_counts(None, start) == [
        MinuteCounts(int(start + MINUTE_COUNTS_KEEP - 60), 1, 0)
    ]
