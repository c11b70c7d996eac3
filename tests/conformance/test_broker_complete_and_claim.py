"""A busy worker's acknowledgements and its next claim: the completions are stored first (the
claim sees the slots and limit keys they free) and answered as ``complete_many`` answers them;
the claim as ``claim`` does.

Each test runs two ways: ``in_claim`` calls the broker's ``complete_and_claim`` (one round
trip) with completions its capabilities say ride in a claim, skipped by capability name
otherwise; ``worker`` goes the fetcher's way (``complete_then_claim``), which decides from
those capabilities and sends the rest as ``complete_many`` then ``claim``, on every broker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import cast

import pytest
from brokerkit import LATER, LEASE, A, Q, claim, params, picture, snapshot

from conformance.conftest import requires
from durq.brokers import FullBroker
from durq.brokers.base import (
    CAP_COMPLETE_AND_CLAIM,
    CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
    CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS,
    CAP_DEPENDENCIES,
    CAP_WAIT_AND_CLAIM,
    ClaimParams,
    CompleteAndClaim,
    CompleteParams,
    Lease,
    LeaseRef,
    WaitAndClaim,
)
from durq.clock import FakeClock
from durq.task import LimitSpec
from durq.worker.fetcher import complete_then_claim, rides_in_claim

Send = Callable[
    [FullBroker, Sequence[CompleteParams], ClaimParams], Awaitable[tuple[list[bool], list[Lease]]]
]


async def in_claim(
    broker: FullBroker, items: Sequence[CompleteParams], claim: ClaimParams
) -> tuple[list[bool], list[Lease]]:
    """The broker's ``complete_and_claim``, for completions it declares it carries."""
    requires(broker, CAP_COMPLETE_AND_CLAIM)
    if any(p.follow_ups or p.group is not None for p in items):
        requires(broker, CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS)
    if any(p.lease.queue != claim.queues[0] for p in items):
        requires(broker, CAP_COMPLETE_AND_CLAIM_ANY_QUEUE)
    assert rides_in_claim(broker.capabilities, items, claim)
    return await cast(CompleteAndClaim, broker).complete_and_claim(items, claim)


async def by_worker(
    broker: FullBroker, items: Sequence[CompleteParams], claim: ClaimParams
) -> tuple[list[bool], list[Lease]]:
    """What the fetcher does: one round trip where the completions ride, else two."""
    held: list[bool] = []
    leases = await complete_then_claim(broker, items, claim, held.extend)
    return held, leases


@pytest.fixture(params=["in_claim", "worker"])
def send(request: pytest.FixtureRequest) -> Send:
    return in_claim if request.param == "in_claim" else by_worker


def claim_params(limit: int, queues: list[str] | None = None) -> ClaimParams:
    return ClaimParams(queues or [Q], limit, "w1", LEASE)


async def enqueue(broker: FullBroker, clock: FakeClock, *ids: str, **options: object) -> None:
    for task_id in ids:
        await broker.enqueue(params(task_id, **options))
        clock.advance(0.001)  # a strict enqueue order on every broker


async def test_completes_then_claims_in_order(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    await enqueue(broker, clock, "t0", "t1", "t2", "t3", "t4")
    first = await claim(broker, limit=2)
    stale = CompleteParams(LeaseRef(Q, "t0", "not-the-token"))
    done, leases = await send(
        broker,
        [CompleteParams(first[0].ref, b"1", retention=60), stale, CompleteParams(first[1].ref)],
        claim_params(2),
    )
    assert done == [True, False, True]
    assert [lease.task.id for lease in leases] == ["t2", "t3"]
    assert all(lease.task.worker_id == "w1" for lease in leases)
    assert await snapshot(broker) == picture(completed="t0", active="t2 t3", pending="t4")
    assert (await broker.admin.get_task(Q, "t0")).result == 1
    stats = await broker.admin.queue_stats(Q)
    assert stats.processed_total == 2


async def test_nothing_to_claim_still_completes(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    await enqueue(broker, clock, "t0")
    (lease,) = await claim(broker)
    done, leases = await send(broker, [CompleteParams(lease.ref, retention=60)], claim_params(5))
    assert (done, list(leases)) == ([True], [])
    assert await snapshot(broker) == picture(completed="t0")


async def test_claims_across_queues_in_the_order_given(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    await enqueue(broker, clock, "a0", "a1")
    await enqueue(broker, clock, "m0", "m1", queue="mail")
    (lease,) = await claim(broker, limit=1, queues=["mail"])
    done, leases = await send(broker, [CompleteParams(lease.ref)], claim_params(3, ["mail", Q]))
    assert done == [True]
    assert [(x.task.queue, x.task.id) for x in leases] == [("mail", "m1"), (Q, "a0"), (Q, "a1")]


async def test_a_completion_of_another_queue_than_the_first_claimed(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    await enqueue(broker, clock, "a0", "a1")
    await enqueue(broker, clock, "m0", queue="mail")
    (lease,) = await claim(broker, limit=1)
    done, leases = await send(broker, [CompleteParams(lease.ref)], claim_params(3, ["mail", Q]))
    assert done == [True]
    assert [(x.task.queue, x.task.id) for x in leases] == [("mail", "m0"), (Q, "a1")]
    assert await snapshot(broker) == picture(active="a1")  # a0 deleted (no retention)


async def test_a_follow_up_is_created_before_the_claim(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    await enqueue(broker, clock, "t0")
    (lease,) = await claim(broker)
    follow_up = params("then:t0", type="test:next")
    done, leases = await send(
        broker, [CompleteParams(lease.ref, None, 60, (follow_up,))], claim_params(2)
    )
    assert done == [True]
    assert [x.task.id for x in leases] == ["then:t0"]


async def test_the_claim_takes_the_limit_slot_the_completion_frees(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    one = (LimitSpec("k", concurrency=1),)
    await enqueue(broker, clock, "k0", "k1", limits=one)
    (lease,) = await claim(broker, limit=2)
    assert lease.task.id == "k0"
    done, leases = await send(broker, [CompleteParams(lease.ref)], claim_params(2))
    assert done == [True]
    assert [x.task.id for x in leases] == ["k1"]
    (stats,) = await broker.admin.list_limits(Q)
    assert stats.running == 1


async def test_the_freed_slot_is_taken_after_a_claim_found_the_key_full(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    """A claim that found the key full between the two (a worker at the limit, idle until
    an attempt ends) changes nothing: the completion's claim takes the held task."""
    one = (LimitSpec("k", concurrency=1),)
    await enqueue(broker, clock, "k0", "k1", "k2", limits=one)
    (lease,) = await claim(broker, limit=3)
    assert lease.task.id == "k0"
    assert await claim(broker, limit=3) == []
    done, leases = await send(broker, [CompleteParams(lease.ref)], claim_params(3))
    assert done == [True]
    assert [x.task.id for x in leases] == ["k1"]
    assert await snapshot(broker) == picture(active="k1", pending="k2")


async def test_a_dependent_the_completion_releases_is_claimed_in_its_place(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    """A task waiting for the completed one is claimable by the claim that carries the
    completion, in claim order (created before t1, it comes first); a second one, past the
    claim's slots, stays pending."""
    requires(broker, CAP_DEPENDENCIES)
    await enqueue(broker, clock, "t0")
    await enqueue(broker, clock, "d0", "d1", after=((Q, "t0"),))
    await enqueue(broker, clock, "t1")
    (lease,) = await claim(broker, limit=1)
    done, leases = await send(broker, [CompleteParams(lease.ref)], claim_params(2))
    assert done == [True]
    assert [x.task.id for x in leases] == ["d0", "d1"]
    assert all(x.task.worker_id == "w1" and x.task.state is A for x in leases)
    assert await snapshot(broker) == picture(active="d0 d1", pending="t1")
    # Leased as a claim leases: its completion is fenced by the token the claim gave.
    done, leases = await send(
        broker, [CompleteParams(leases[0].ref), CompleteParams(leases[1].ref)], claim_params(1)
    )
    assert done == [True, True] and [x.task.id for x in leases] == ["t1"]


async def test_a_released_dependent_takes_its_place_in_the_claim_order(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    """The released task ranks among the pending ones as if the claim came after the
    completion: before later tasks of its priority, after earlier ones, within the limit."""
    requires(broker, CAP_DEPENDENCIES)
    await enqueue(broker, clock, "t0", "a")
    await enqueue(broker, clock, "d", after=((Q, "t0"),))
    await enqueue(broker, clock, "b", "c")
    await enqueue(broker, clock, "high", after=((Q, "t0"),), priority=5)
    (lease,) = await claim(broker, limit=1)
    assert lease.task.id == "t0"
    done, leases = await send(broker, [CompleteParams(lease.ref)], claim_params(3))
    assert done == [True]
    assert [x.task.id for x in leases] == ["high", "a", "d"]
    assert await snapshot(broker) == picture(active="high a d", pending="b c")


async def test_a_released_dependent_with_a_limit_or_due_later(
    broker: FullBroker, clock: FakeClock, send: Send
) -> None:
    """Released with a flow-control limit, it is claimed as limited tasks are (its slot
    counted); released with its due time ahead, it is scheduled, not claimed."""
    requires(broker, CAP_DEPENDENCIES)
    one = (LimitSpec("k", concurrency=1),)
    await enqueue(broker, clock, "t0")
    await enqueue(broker, clock, "k0", after=((Q, "t0"),), limits=one)
    await enqueue(broker, clock, "later", after=((Q, "t0"),), process_in=LATER)
    (lease,) = await claim(broker, limit=1)
    done, leases = await send(broker, [CompleteParams(lease.ref)], claim_params(3))
    assert done == [True]
    assert [x.task.id for x in leases] == ["k0"]
    (stats,) = await broker.admin.list_limits(Q)
    assert stats.running == 1
    assert await snapshot(broker) == picture(active="k0", scheduled="later")


async def test_no_completions_or_no_slots(broker: FullBroker, clock: FakeClock) -> None:
    """Neither rides in a claim: a claim alone, or the completions alone."""
    await enqueue(broker, clock, "t0", "t1")
    done, leases = await by_worker(broker, [], claim_params(1))
    assert done == [] and [lease.task.id for lease in leases] == ["t0"]
    done, leases = await by_worker(
        broker, [CompleteParams(leases[0].ref, retention=60)], claim_params(0)
    )
    assert (done, list(leases)) == ([True], [])
    assert await snapshot(broker) == picture(completed="t0", pending="t1")


def test_the_declared_capabilities_agree(broker: FullBroker) -> None:
    """What a broker says rides in its claim, it has the method for; the two wider
    capabilities widen the first one and mean nothing without it."""
    caps = broker.capabilities
    assert (CAP_COMPLETE_AND_CLAIM in caps) == isinstance(broker, CompleteAndClaim)
    assert (CAP_WAIT_AND_CLAIM in caps) == isinstance(broker, WaitAndClaim)
    if CAP_COMPLETE_AND_CLAIM not in caps:
        assert not caps & {CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS, CAP_COMPLETE_AND_CLAIM_ANY_QUEUE}
