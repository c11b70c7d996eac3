"""``complete_and_claim``: a busy worker's acknowledgements and its next claim in one call.
The completions are stored first (the claim sees the slots and limit keys they free) and
answered as ``complete_many`` answers them; the claim as ``claim`` does."""

from __future__ import annotations

from brokerkit import LEASE, Q, claim, params, picture, snapshot

from conformance.conftest import requires
from durq.brokers import FullBroker
from durq.brokers.base import CAP_LIMITS, ClaimParams, CompleteParams, LeaseRef
from durq.clock import FakeClock
from durq.task import LimitSpec


def claim_params(limit: int, queues: list[str] | None = None) -> ClaimParams:
    return ClaimParams(queues or [Q], limit, "w1", LEASE)


async def enqueue(broker: FullBroker, clock: FakeClock, *ids: str, **options: object) -> None:
    for task_id in ids:
        await broker.enqueue(params(task_id, **options))
        clock.advance(0.001)  # a strict enqueue order on every broker


async def test_completes_then_claims_in_order(broker: FullBroker, clock: FakeClock) -> None:
    await enqueue(broker, clock, "t0", "t1", "t2", "t3", "t4")
    first = await claim(broker, limit=2)
    stale = CompleteParams(LeaseRef(Q, "t0", "not-the-token"))
    done, leases = await broker.complete_and_claim(
        [CompleteParams(first[0].ref, b"1", retention=60), stale, CompleteParams(first[1].ref)],
        claim_params(2),
    )
    assert done == [True, False, True]
    assert [lease.task.id for lease in leases] == ["t2", "t3"]
    assert all(lease.task.worker_id == "w1" for lease in leases)
    assert await snapshot(broker) == picture(completed="t0", active="t2 t3", pending="t4")
    assert (await broker.get_task(Q, "t0")).result == 1
    stats = await broker.queue_stats(Q)
    assert stats.processed_total == 2


async def test_nothing_to_claim_still_completes(broker: FullBroker, clock: FakeClock) -> None:
    await enqueue(broker, clock, "t0")
    (lease,) = await claim(broker)
    done, leases = await broker.complete_and_claim(
        [CompleteParams(lease.ref, retention=60)], claim_params(5)
    )
    assert (done, list(leases)) == ([True], [])
    assert await snapshot(broker) == picture(completed="t0")


async def test_no_completions_or_no_slots(broker: FullBroker, clock: FakeClock) -> None:
    await enqueue(broker, clock, "t0", "t1")
    done, leases = await broker.complete_and_claim([], claim_params(1))
    assert done == [] and [lease.task.id for lease in leases] == ["t0"]
    done, leases = await broker.complete_and_claim(
        [CompleteParams(leases[0].ref, retention=60)], claim_params(0)
    )
    assert (done, list(leases)) == ([True], [])
    assert await snapshot(broker) == picture(completed="t0", pending="t1")


async def test_claims_across_queues_in_the_order_given(
    broker: FullBroker, clock: FakeClock
) -> None:
    await enqueue(broker, clock, "a0", "a1")
    await broker.enqueue(params("m0", "mail"))
    (lease,) = await claim(broker, limit=1)
    done, leases = await broker.complete_and_claim(
        [CompleteParams(lease.ref)], claim_params(3, ["mail", Q])
    )
    assert done == [True]
    assert [(x.task.queue, x.task.id) for x in leases] == [("mail", "m0"), (Q, "a1")]


async def test_a_follow_up_is_created_before_the_claim(
    broker: FullBroker, clock: FakeClock
) -> None:
    await enqueue(broker, clock, "t0")
    (lease,) = await claim(broker)
    follow_up = params("then:t0", type="test:next")
    done, leases = await broker.complete_and_claim(
        [CompleteParams(lease.ref, None, 60, (follow_up,))], claim_params(2)
    )
    assert done == [True]
    assert [x.task.id for x in leases] == ["then:t0"]


async def test_the_claim_takes_the_limit_slot_the_completion_frees(
    broker: FullBroker, clock: FakeClock
) -> None:
    requires(broker, CAP_LIMITS)
    one = (LimitSpec("k", concurrency=1),)
    await enqueue(broker, clock, "k0", "k1", limits=one)
    (lease,) = await claim(broker, limit=2)
    assert lease.task.id == "k0"
    done, leases = await broker.complete_and_claim([CompleteParams(lease.ref)], claim_params(2))
    assert done == [True]
    assert [x.task.id for x in leases] == ["k1"]
    (stats,) = await broker.list_limits(Q)
    assert stats.running == 1
