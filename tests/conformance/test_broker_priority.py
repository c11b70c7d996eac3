"""Task priority within a queue (W8): higher first, then due time, then enqueue order; kept through
retries, rescues, requeues and the inspector's run."""

from __future__ import annotations

from brokerkit import LATER, P, Q, S, X, claim, claim_ids, params

from durq.brokers import FullBroker
from durq.brokers.base import ArchiveParams, ClaimParams, RetryParams, TaskMove
from durq.clock import FakeClock


async def claim_direct(broker: FullBroker, limit: int = 10) -> list[str]:
    """Claim without a promote_due first: due scheduled/retry tasks must still be ordered."""
    got = await broker.claim(
        ClaimParams(queues=[Q], limit=limit, worker_id="w1", lease_seconds=30.0)
    )
    return [lease.task.id for lease in got]


async def test_claim_order_priority_then_due_time_then_enqueue_order(
    broker: FullBroker, clock: FakeClock
) -> None:
    t0 = clock.now()
    await broker.enqueue(params("low-early", priority=-5))  # ready at t0
    await broker.enqueue(params("mid-later-due", priority=3, process_at=t0 + 0.5))
    clock.advance(1)
    await broker.enqueue(params("mid-a", priority=3))  # ready at t0 + 1
    await broker.enqueue(params("zero", priority=0))
    await broker.enqueue(params("top", priority=100))
    await broker.enqueue(params("mid-b", priority=3))  # same time as mid-a, enqueued after
    await broker.enqueue(params("bottom", priority=-100))
    clock.advance(1)
    assert await claim_ids(broker, limit=10) == [
        "top",
        "mid-later-due",  # due at t0 + 0.5: before mid-a and mid-b, due at t0 + 1
        "mid-a",
        "mid-b",
        "zero",
        "low-early",
        "bottom",
    ]


async def test_tasks_falling_due_together_are_claimed_by_priority(
    broker: FullBroker, clock: FakeClock
) -> None:
    t0 = clock.now()
    await broker.enqueue(params("a", priority=0, process_at=t0 + 10))
    await broker.enqueue(params("b", priority=7, process_at=t0 + 20))
    await broker.enqueue(params("c", priority=-1, process_at=t0 + 5))
    clock.advance(30)
    # One at a time, with no promoter run: the claim itself must see all three in order.
    assert await claim_direct(broker, limit=1) == ["b"]
    assert await claim_direct(broker, limit=1) == ["a"]
    assert await claim_direct(broker, limit=1) == ["c"]


async def test_a_task_falling_due_is_claimed_before_pending_tasks_due_after_it(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A scheduled task that fell due is claimed in its order at once, even by a claim with
    fewer slots than the pending tasks ahead of it in the claim index."""
    t0 = clock.now()
    await broker.enqueue(params("scheduled", process_at=t0 + 5))
    clock.advance(10)
    await broker.enqueue(params("pending-a"))  # due at t0 + 10, after "scheduled"
    await broker.enqueue(params("pending-b"))
    assert await claim_direct(broker, limit=1) == ["scheduled"]
    assert await claim_direct(broker, limit=1) == ["pending-a"]
    await broker.enqueue(params("urgent", priority=5, process_at=clock.now() + 1))
    clock.advance(2)
    assert await claim_direct(broker, limit=1) == ["urgent"]
    assert await claim_direct(broker, limit=10) == ["pending-b"]


async def test_a_delayed_high_priority_task_does_not_run_before_it_is_due(
    broker: FullBroker, clock: FakeClock
) -> None:
    t0 = clock.now()
    await broker.enqueue(params("urgent-later", priority=100, process_at=t0 + 60))
    await broker.enqueue(params("normal"))
    assert await claim_direct(broker, limit=10) == ["normal"]
    assert await claim_ids(broker, limit=10) == []
    clock.advance(59)
    assert await claim_ids(broker, limit=10) == []
    clock.advance(1)
    assert await claim_ids(broker, limit=10) == ["urgent-later"]


async def test_a_retried_task_keeps_its_priority(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("vip", priority=9))
    (lease,) = await claim(broker, limit=1)
    assert lease.task.priority == 9
    assert await broker.retry(RetryParams(lease.ref, "boom", delay=5))
    assert (await broker.admin.get_task(Q, "vip")).priority == 9
    clock.advance(1)
    await broker.enqueue(params("plain-1"))
    await broker.enqueue(params("plain-2", priority=8))
    clock.advance(10)
    # vip became due after plain-1 and plain-2 were enqueued, yet goes first.
    assert await claim_direct(broker, limit=10) == ["vip", "plain-2", "plain-1"]


async def test_a_rescued_task_keeps_its_priority(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("vip", priority=50))
    await claim(broker, limit=1, lease=10)
    clock.advance(11)
    (expired,) = await broker.expired_leases(10)
    now = clock.now()
    rescue = RetryParams(expired.ref, "lost", lost=True, expired_by=now)
    assert await broker.move_leases([rescue]) == [True]
    await broker.enqueue(params("plain"))
    clock.advance(1)
    assert await claim_direct(broker, limit=10) == ["vip", "plain"]


async def test_a_requeued_task_keeps_its_priority(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("vip", priority=-3))
    (lease,) = await claim(broker, limit=1)
    await broker.enqueue(params("lower", priority=-4))
    await broker.enqueue(params("higher", priority=-2))
    assert await broker.requeue(lease.ref)
    assert await claim_ids(broker, limit=10) == ["higher", "vip", "lower"]


async def test_the_inspectors_run_keeps_the_priority(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("vip", priority=20, process_at=clock.now() + LATER))
    await broker.enqueue(params("doomed", priority=30))
    (lease,) = await claim(broker, limit=1)
    assert lease.task.id == "doomed"
    assert await broker.archive(ArchiveParams(lease.ref, "gave up"))
    await broker.enqueue(params("plain", priority=10))
    ran = await broker.admin.move_task(TaskMove(Q, "vip", expect=S, to=P))
    assert ran is not None and ran.priority == 20
    assert await broker.admin.move_all(Q, X, P) == 1
    assert await claim_ids(broker, limit=10) == ["doomed", "vip", "plain"]


async def test_priority_is_shown_on_every_read(broker: FullBroker, clock: FakeClock) -> None:
    created = await broker.enqueue(params("one", priority=-7))
    assert created.priority == -7
    outcomes = await broker.enqueue_many(
        [params("two", priority=42), params("three"), params("four", priority=-100)]
    )
    assert [o.info.priority for o in outcomes if o.info] == [42, 0, -100]
    assert (await broker.admin.get_task(Q, "one")).priority == -7
    listed = {t.id: t.priority for t in await broker.admin.list_tasks(Q, P)}
    assert listed == {"one": -7, "two": 42, "three": 0, "four": -100}


async def test_oldest_pending_age_looks_past_higher_priorities(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("old", priority=-1))
    clock.advance(100)
    await broker.enqueue(params("new", priority=5))
    await broker.enqueue(params("newer", priority=0))
    clock.advance(10)
    stats = await broker.admin.queue_stats(Q)
    assert abs(stats.oldest_pending_age - 110) < 0.01
