"""Fair limits (W22) on every broker: the partitions of a fair key take turns in the claim,
a partition new to the line waits one turn at most, a full partition is held while the
others take its turns, and the template keeps its place among the queue's other tasks."""

from __future__ import annotations

import pytest
from brokerkit import A, P, claim, claim_ids, params, snapshot

import durq
from durq.brokers import FullBroker
from durq.brokers.base import CompleteParams, TaskMove
from durq.clock import FakeClock
from durq.errors import ValidationError
from durq.limits import resolve_all
from durq.states import TaskState
from durq.task import LimitSpec

TENANT = durq.Limit("tenant:{tenant}", concurrency=100, fair=True)


def fair(tenant: str, concurrency: int = 100) -> LimitSpec:
    return LimitSpec(f"tenant:{tenant}", concurrency=concurrency, fair="tenant:{tenant}")


async def enqueue(
    broker: FullBroker, clock: FakeClock, task_id: str, *limits: LimitSpec, priority: int = 0
) -> None:
    await broker.enqueue(params(task_id, limits=tuple(limits), priority=priority))
    clock.advance(0.001)  # a strict enqueue order on every broker


async def one_by_one(broker: FullBroker, claims: int) -> list[str]:
    """The ids ``claims`` claims of one task each take, in order."""
    taken: list[str] = []
    for _ in range(claims):
        taken += [lease.task.id for lease in await claim(broker, limit=1)]
    return taken


async def test_W22_partitions_take_turns(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(4):
        await enqueue(broker, clock, f"a{i}", fair("a"))
    await enqueue(broker, clock, "b0", fair("b"))
    await enqueue(broker, clock, "c0", fair("c"))
    await enqueue(broker, clock, "c1", fair("c"))
    assert await one_by_one(broker, 8) == ["a0", "b0", "c0", "a1", "c1", "a2", "a3"]
    info = await broker.admin.get_task("default", "b0")
    assert info.limits == (fair("b"),)


async def test_W22_a_claim_of_several_takes_them_in_turns(
    broker: FullBroker, clock: FakeClock
) -> None:
    """One claim of many gives the same order as claims of one; enqueued in one batch."""
    batch = [params(f"a{i}", limits=(fair("a"),)) for i in range(3)]
    batch += [params("b0", limits=(fair("b"),)), params("b1", limits=(fair("b"),))]
    await broker.enqueue_many(batch)
    assert await claim_ids(broker, limit=4) == ["a0", "b0", "a1", "b1"]
    assert await claim_ids(broker, limit=4) == ["a2"]


async def test_W22_a_newcomer_waits_one_turn_at_most(broker: FullBroker, clock: FakeClock) -> None:
    """A partition that comes after a round has gone starts at the round, not at turn 1
    (which would put its whole backlog before the partition that waited)."""
    for i in range(4):
        await enqueue(broker, clock, f"a{i}", fair("a"))
    assert await one_by_one(broker, 2) == ["a0", "a1"]
    for i in range(3):
        await enqueue(broker, clock, f"b{i}", fair("b"))
    assert await one_by_one(broker, 6) == ["a2", "b0", "a3", "b1", "b2"]


async def test_W22_a_full_partition_is_held_and_the_others_take_its_turns(
    broker: FullBroker, clock: FakeClock
) -> None:
    for i in range(4):
        await enqueue(broker, clock, f"a{i}", fair("a", concurrency=1))
    await enqueue(broker, clock, "b0", fair("b", concurrency=1))
    leases = await claim(broker, limit=5)
    assert [x.task.id for x in leases] == ["a0", "b0"]
    assert await snapshot(broker) == {A: ["a0", "b0"], P: ["a1", "a2", "a3"]}
    assert (await broker.admin.get_task("default", "a1")).held_by == "tenant:a"
    # The end of a0 lets its partition's next turn back.
    first = leases[0]
    assert await broker.complete(CompleteParams(lease=first.ref, result=b"null"))
    assert await claim_ids(broker, limit=5) == ["a1"]


async def test_W22_priority_first_then_turns(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(3):
        await enqueue(broker, clock, f"a{i}", fair("a"))
    await enqueue(broker, clock, "b0", fair("b"))
    await enqueue(broker, clock, "a9", fair("a"), priority=5)
    assert await one_by_one(broker, 6) == ["a9", "a0", "b0", "a1", "a2"]


async def test_W22_the_template_keeps_its_place_among_other_tasks(
    broker: FullBroker, clock: FakeClock
) -> None:
    """Fairness orders the template's own tasks; a task without the fair limit starts when
    the template's first task in queue order has gone."""
    for i in range(3):
        await enqueue(broker, clock, f"a{i}", fair("a"))
    await enqueue(broker, clock, "x0")
    await enqueue(broker, clock, "b0", fair("b"))
    assert await one_by_one(broker, 6) == ["a0", "b0", "a1", "a2", "x0"]


async def test_W22_a_fair_limit_resolves_its_partition_from_the_payload() -> None:
    specs = resolve_all((durq.Limit("all", concurrency=5), TENANT), {"tenant": "acme"})
    assert specs == (fair("acme"), LimitSpec("all", concurrency=5))  # the fair one first
    with pytest.raises(ValidationError, match="naming payload fields"):
        durq.Limit("global", concurrency=1, fair=True)
    with pytest.raises(ValidationError, match="one fair limit"):
        resolve_all((TENANT, durq.Limit("x:{tenant}", rate="1/s", fair=True)), {"tenant": "a"})


async def test_W22_turns_hold_after_most_of_the_line_is_deleted_or_let_back(
    broker: FullBroker, clock: FakeClock
) -> None:
    """Tasks that leave the line (deleted, archived, run again) in numbers leave the turn
    order of the rest as it was: 100 tasks of a and 100 of b, of which every task but each
    tenth is deleted or archived, and two are made pending again."""
    for i in range(100):
        await enqueue(broker, clock, f"a{i}", fair("a"))
        await enqueue(broker, clock, f"b{i}", fair("b"))
    for i in range(100):
        if i % 10:
            for tenant, to in (("a", None), ("b", TaskState.ARCHIVED)):
                move = TaskMove("default", f"{tenant}{i}", TaskState.PENDING, to)
                assert await broker.admin.move_task(move) is not None
    for task_id in ("a5", "b5"):  # archived or deleted above: only b5 can run again
        await broker.admin.move_task(
            TaskMove("default", task_id, TaskState.ARCHIVED, TaskState.PENDING)
        )
    # b5 keeps its turn (6th of b): between b0's and the tenth tasks'
    expected = ["a0", "b0", "b5", *(f"{t}{i}" for i in range(10, 100, 10) for t in "ab")]
    assert await one_by_one(broker, 22) == expected
