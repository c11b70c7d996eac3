"""Overrides of a key's limit at run time (W23) on every broker: an operator's concurrency or
rate wins over every task's own until reset, at the next claim, atomically with it; a key no
claim counted can be overridden; lowering starts nothing until the running drop below, and
raising or resetting lets held tasks back."""

from __future__ import annotations

import asyncio

import pytest
from brokerkit import A, P, claim, claim_ids, params, snapshot

from durq.brokers import FullBroker
from durq.brokers.base import CompleteParams, LimitOverride
from durq.clock import FakeClock
from durq.errors import QueueNotFoundError
from durq.task import LimitSpec


def conc(key: str, n: int) -> LimitSpec:
    return LimitSpec(key, concurrency=n)


async def enqueue(
    broker: FullBroker, clock: FakeClock, task_id: str, *limits: LimitSpec, queue: str = "default"
) -> None:
    await broker.enqueue(params(task_id, queue, limits=tuple(limits)))
    clock.advance(0.001)  # a strict enqueue order on every broker


async def override(
    broker: FullBroker,
    key: str,
    concurrency: int | None = None,
    rate: tuple[int, float] | None = None,
    queue: str = "default",
) -> None:
    rate_n, per = rate if rate is not None else (None, None)
    await broker.admin.set_limit(LimitOverride(queue, key, concurrency, rate_n, per))


async def key_of(broker: FullBroker, key: str, queue: str = "default") -> tuple[object, ...]:
    """(running, held, the last task's concurrency, the override's concurrency and rate)."""
    (s,) = [s for s in await broker.admin.list_limits(queue) if s.key == key]
    return (s.running, s.waiting, s.concurrency, s.override_concurrency, s.override_rate)


async def test_W23_an_override_wins_over_every_tasks_limit(make_broker, clock: FakeClock) -> None:
    one, two = await make_broker(), await make_broker()
    for i in range(5):
        await enqueue(one, clock, f"k{i}", conc("k", 1))
    assert await claim_ids(one, limit=10) == ["k0"]
    await override(two, "k", concurrency=3)
    assert await key_of(one, "k") == (1, 4, 1, 3, None)
    # Another broker object (another worker) applies it at its next claim.
    assert await claim_ids(two, limit=10) == ["k1", "k2"]
    assert await claim_ids(one, limit=10) == []
    assert await snapshot(one) == {A: ["k0", "k1", "k2"], P: ["k3", "k4"]}
    assert await key_of(one, "k") == (3, 2, 1, 3, None)


async def test_W23_concurrency_zero_holds_the_key_and_a_reset_lets_it_go(
    broker: FullBroker, clock: FakeClock
) -> None:
    for i in range(3):
        await enqueue(broker, clock, f"k{i}", conc("k", 2))
    await enqueue(broker, clock, "j0", conc("j", 1))
    await enqueue(broker, clock, "u0")
    await override(broker, "k", concurrency=0)
    assert await claim_ids(broker, limit=10) == ["j0", "u0"]
    assert await key_of(broker, "k") == (0, 3, None, 0, None)
    assert await broker.admin.reset_limit("default", "k")
    assert not await broker.admin.reset_limit("default", "k")  # nothing left to reset
    assert await claim_ids(broker, limit=10) == ["k0", "k1"]  # the tasks' own 2 again
    assert await key_of(broker, "k") == (2, 1, 2, None, None)


async def test_W23_lowering_below_running_starts_nothing_until_they_drop_below(
    broker: FullBroker, clock: FakeClock
) -> None:
    for i in range(5):
        await enqueue(broker, clock, f"k{i}", conc("k", 3))
    leases = await claim(broker, limit=3)
    assert [x.task.id for x in leases] == ["k0", "k1", "k2"]
    await override(broker, "k", concurrency=1)
    assert await snapshot(broker) == {A: ["k0", "k1", "k2"], P: ["k3", "k4"]}  # untouched
    assert await broker.complete(CompleteParams(leases[0].ref))
    assert await claim_ids(broker, limit=10) == []
    assert await broker.complete(CompleteParams(leases[1].ref))
    assert await claim_ids(broker, limit=10) == []  # 1 running: at the override
    assert await broker.complete(CompleteParams(leases[2].ref))
    assert await claim_ids(broker, limit=10) == ["k3"]
    assert await key_of(broker, "k") == (1, 1, 3, 1, None)


async def test_W23_raising_lets_held_tasks_back_at_the_next_claim(
    broker: FullBroker, clock: FakeClock
) -> None:
    for i in range(4):
        await enqueue(broker, clock, f"k{i}", conc("k", 1))
    assert await claim_ids(broker, limit=10) == ["k0"]
    assert await claim_ids(broker, limit=10) == []
    await override(broker, "k", concurrency=3)
    assert await claim_ids(broker, limit=10) == ["k1", "k2"]
    await override(broker, "k", concurrency=10)
    assert await claim_ids(broker, limit=10) == ["k3"]
    assert await key_of(broker, "k") == (4, 0, 1, 10, None)


async def test_W23_a_rate_override_and_a_dimension_left_to_the_tasks(
    broker: FullBroker, clock: FakeClock
) -> None:
    for i in range(6):
        await enqueue(broker, clock, f"k{i}", LimitSpec("k", concurrency=5, rate=1, per=10.0))
    assert await claim_ids(broker, limit=10) == ["k0"]  # a full bucket of 1
    await override(broker, "k", rate=(3, 10.0))  # the concurrency stays the tasks' 5
    clock.advance(10)
    assert await claim_ids(broker, limit=10) == ["k1", "k2", "k3"]  # refilled at 3 per 10 s
    (s,) = await broker.admin.list_limits("default")
    assert (s.rate, s.per, s.override_rate, s.override_per) == (1, 10.0, 3, 10.0)
    assert (s.limit_concurrency, s.limit_rate) == (5, (3, 10.0))
    assert s.tokens is not None and abs(s.tokens) < 1e-6
    clock.advance(10)
    assert await claim_ids(broker, limit=10) == ["k4"]  # 4 running, 1 slot by the tasks' 5
    await override(broker, "k", concurrency=6, rate=(3, 10.0))
    assert await claim_ids(broker, limit=10) == ["k5"]


async def test_W23_an_override_of_a_key_no_claim_counted(
    broker: FullBroker, clock: FakeClock
) -> None:
    await enqueue(broker, clock, "u0")  # the queue exists
    await override(broker, "partner:acme", concurrency=1)
    (s,) = await broker.admin.list_limits("default")
    assert (s.key, s.running, s.concurrency, s.override_concurrency) == (
        "partner:acme",
        0,
        None,
        1,
    )
    assert s.tokens is None
    for i in range(3):
        await enqueue(broker, clock, f"a{i}", conc("partner:acme", 5))
    assert await claim_ids(broker, limit=10) == ["u0", "a0"]
    # A rate set on a key no task started has a full bucket.
    await override(broker, "api", rate=(2, 60.0))
    for i in range(3):
        await enqueue(broker, clock, f"r{i}", LimitSpec("api", rate=100, per=1.0))
    assert await claim_ids(broker, limit=10) == ["r0", "r1"]


async def test_W23_an_override_counts_in_its_queue_only(
    broker: FullBroker, clock: FakeClock
) -> None:
    for queue in ("default", "other"):
        for i in range(2):
            await enqueue(broker, clock, f"k{i}", conc("k", 2), queue=queue)
    await override(broker, "k", concurrency=0, queue="other")
    assert await claim_ids(broker, "other", limit=10) == []
    assert await claim_ids(broker, "default", limit=10) == ["k0", "k1"]
    with pytest.raises(QueueNotFoundError):
        await override(broker, "k", concurrency=1, queue="nowhere")
    assert not await broker.admin.reset_limit("nowhere", "k")


async def test_W23_an_override_of_a_fair_partition(broker: FullBroker, clock: FakeClock) -> None:
    """A partition paused by an override is held while the others take its turns; its
    reset gives them back their turns."""

    def fair(tenant: str) -> LimitSpec:
        return LimitSpec(f"tenant:{tenant}", concurrency=5, fair="tenant:{tenant}")

    for i in range(3):
        await enqueue(broker, clock, f"a{i}", fair("a"))
    for i in range(2):
        await enqueue(broker, clock, f"b{i}", fair("b"))
    await override(broker, "tenant:a", concurrency=0)
    assert await claim_ids(broker, limit=1) == ["b0"]
    assert await claim_ids(broker, limit=1) == ["b1"]
    assert await claim_ids(broker, limit=10) == []
    await override(broker, "tenant:a", concurrency=2)
    assert await claim_ids(broker, limit=10) == ["a0", "a1"]
    assert await broker.admin.reset_limit("default", "tenant:a")
    assert await claim_ids(broker, limit=10) == ["a2"]


async def test_W23_setting_an_override_wakes_a_waiting_worker(
    make_broker, clock: FakeClock
) -> None:
    worker, operator = await make_broker(), await make_broker()
    await enqueue(operator, clock, "a", conc("k", 1))
    await enqueue(operator, clock, "b", conc("k", 1))
    assert await claim_ids(worker, limit=10) == ["a"]
    assert await claim_ids(worker, limit=10) == []  # b is held
    waiting = asyncio.create_task(worker.wait_for_work(["default"], timeout=30))
    await asyncio.sleep(0.05)
    await override(operator, "k", concurrency=2)
    assert await asyncio.wait_for(waiting, 5.0)
    assert await claim_ids(worker, limit=10) == ["b"]


async def test_W23_an_override_below_a_tasks_cost_holds_it_until_raised(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A task's cost is its own: under an override of 1 a task of cost 2 waits (the others
    of cost 1 start), and starts once the override allows 2."""
    await enqueue(broker, clock, "big", LimitSpec("k", concurrency=4, cost=2))
    await enqueue(broker, clock, "small", conc("k", 4))
    await override(broker, "k", concurrency=1)
    assert await claim_ids(broker, limit=10) == ["small"]
    assert await claim_ids(broker, limit=10) == []
    await override(broker, "k", concurrency=3)
    assert await claim_ids(broker, limit=10) == ["big"]
    assert await key_of(broker, "k") == (3, 0, 4, 3, None)


async def test_W23_an_override_pauses_a_sequence_but_never_widens_it(
    broker: FullBroker, clock: FakeClock
) -> None:
    seq = LimitSpec("acct:1", concurrency=1, sequence=True)
    for i in range(3):
        await enqueue(broker, clock, f"s{i}", seq)
    await override(broker, "acct:1", concurrency=0)
    assert await claim_ids(broker, limit=10) == []
    await override(broker, "acct:1", concurrency=3)
    assert await claim_ids(broker, limit=10) == ["s0"]  # still one at a time, in order
    assert await claim_ids(broker, limit=10) == []
