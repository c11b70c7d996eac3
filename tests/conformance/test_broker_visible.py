"""What the inspector shows of uniqueness and fair limits, on every broker: the partitions
of a queue's fair limits with their waiting and running tasks (biggest first, the rest
summed), and the unique keys its tasks hold with their tasks (soonest due first)."""

from __future__ import annotations

import pytest
from brokerkit import LATER, Q, claim, params

import durq
from durq.brokers import FullBroker
from durq.brokers.base import CompleteParams
from durq.brokers.views import PartitionDepth
from durq.clock import FakeClock, to_datetime
from durq.errors import QueueNotFoundError
from durq.states import TaskState
from durq.task import LimitSpec


def fair(tenant: str, concurrency: int = 100, template: str = "tenant:{tenant}") -> LimitSpec:
    key = template.replace("{tenant}", tenant).replace("{region}", tenant)
    return LimitSpec(key, concurrency=concurrency, fair=template)


async def enqueue(broker: FullBroker, clock: FakeClock, task_id: str, *limits: LimitSpec) -> None:
    await broker.enqueue(params(task_id, limits=tuple(limits)))
    clock.advance(0.001)  # a strict enqueue order on every broker


def depth(template: str, key: str, pending: int, running: int, n: int = 1) -> PartitionDepth:
    return PartitionDepth(template, key, pending, running, n)


async def test_W22_partitions_biggest_first_and_the_rest_summed(
    broker: FullBroker, clock: FakeClock
) -> None:
    for i in range(4):
        await enqueue(broker, clock, f"a{i}", fair("a"))
    await enqueue(broker, clock, "b0", fair("b"))
    await enqueue(broker, clock, "c0", fair("c"))
    await enqueue(broker, clock, "c1", fair("c"))
    await enqueue(broker, clock, "x0", fair("eu", template="region:{region}"))
    await enqueue(broker, clock, "plain")  # no fair limit: not shown
    await broker.enqueue(params("later", limits=(fair("a"),), process_in=LATER))  # scheduled
    # Partitions take turns: a0 and b0 start.
    assert [lease.task.id for lease in await claim(broker, limit=2)] == ["a0", "b0"]

    seen = await broker.admin.fair_partitions(Q, top=2)
    assert seen.queue == Q
    assert seen.templates == (
        depth("region:{region}", "", 1, 0, 1),
        depth("tenant:{tenant}", "", 5, 2, 3),
    )
    assert seen.top == (
        depth("tenant:{tenant}", "tenant:a", 3, 1),
        depth("tenant:{tenant}", "tenant:c", 2, 0),
    )
    assert seen.others == depth("", "", 1, 1, 2)  # tenant:b and region:eu
    every = await broker.admin.fair_partitions(Q, top=10)
    assert [(p.key, p.pending, p.running) for p in every.top] == [
        ("tenant:a", 3, 1),
        ("tenant:c", 2, 0),
        ("region:eu", 1, 0),  # equal sizes: by template, then key
        ("tenant:b", 0, 1),
    ]
    assert every.others == depth("", "", 0, 0, 0)


async def test_W22_held_tasks_count_as_waiting_and_ended_ones_not_at_all(
    broker: FullBroker, clock: FakeClock
) -> None:
    await enqueue(broker, clock, "d0", fair("d", concurrency=1))
    await enqueue(broker, clock, "d1", fair("d", concurrency=1))
    leases = await claim(broker, limit=5)
    assert [lease.task.id for lease in leases] == ["d0"]  # d1 is held on its full partition
    assert (await broker.admin.get_task(Q, "d1")).held_by == "tenant:d"
    seen = await broker.admin.fair_partitions(Q)
    assert seen.top == (depth("tenant:{tenant}", "tenant:d", 1, 1),)
    assert await broker.complete(CompleteParams(lease=leases[0].ref, result=b"null"))
    seen = await broker.admin.fair_partitions(Q)
    assert seen.top == (depth("tenant:{tenant}", "tenant:d", 1, 0),)
    assert [lease.task.id for lease in await claim(broker, limit=5)] == ["d1"]
    assert (await broker.admin.fair_partitions(Q)).top == (
        depth("tenant:{tenant}", "tenant:d", 0, 1),
    )


async def test_W22_a_queue_without_fair_limits_and_an_unknown_queue(broker: FullBroker) -> None:
    await broker.enqueue(params("t1", limits=(LimitSpec("plain", concurrency=2),)))
    seen = await broker.admin.fair_partitions(Q)
    assert (seen.templates, seen.top) == ((), ())
    with pytest.raises(QueueNotFoundError):
        await broker.admin.fair_partitions("nowhere")


async def test_E4_unique_keys_held_soonest_due_first(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t1", unique_key="k1", unique_ttl=LATER, process_in=50))
    # The app always gives a key its time (UNTIL_FINISHED when nothing bounds it).
    await broker.enqueue(params("t2", unique_key="k2", unique_ttl=LATER))
    await broker.enqueue(params("t3", unique_key="k3", unique_ttl=10))  # lets go soon
    await broker.enqueue(params("t4"))  # holds none
    await broker.enqueue(params("t5", unique_key="k5", unique_ttl=LATER, process_in=100))
    await broker.enqueue(params("t6", "other", unique_key="k6", unique_ttl=LATER))  # another queue
    assert [lease.task.id for lease in await claim(broker, limit=1)] == ["t2"]
    clock.advance(20)

    page = await broker.admin.list_unique(Q, limit=2)
    assert page.total == 3 and page.complete
    assert [(h.key, h.task.id, h.task.state) for h in page.holds] == [
        ("k2", "t2", TaskState.ACTIVE),
        ("k1", "t1", TaskState.SCHEDULED),
    ]
    scheduled = page.holds[1].task
    assert scheduled.next_process_at is not None and scheduled.unique_until is not None
    assert scheduled.unique_until > scheduled.next_process_at
    every = await broker.admin.list_unique(Q, limit=10)
    assert [h.task.id for h in every.holds] == ["t2", "t1", "t5"]
    with pytest.raises(QueueNotFoundError):
        await broker.admin.list_unique("nowhere")


async def test_E4_a_finished_task_holds_no_key(broker: FullBroker) -> None:
    await broker.enqueue(params("t1", unique_key="k1", unique_ttl=LATER))
    (lease,) = await claim(broker, limit=1)
    assert await broker.complete(CompleteParams(lease=lease.ref, result=b"null"))
    page = await broker.admin.list_unique(Q)
    assert (page.holds, page.total) == ((), 0)


async def test_E4_a_debounced_task_shows_when_it_runs_at_the_latest(
    broker_url: str, clock: FakeClock
) -> None:
    """Each twin moves the task ``wait`` later, never past ``max_wait`` after the first:
    the inspector shows both moments, read from what the task was stored with."""
    app = durq.App(broker_url, clock=clock)
    try:
        migrator = app.new_broker()
        await migrator.migrate()
        await migrator.close()
        debounce = durq.Debounce("account", wait=30, max_wait=120)
        start = clock.now()
        first = await app.enqueue("crm:sync", {"account": 1, "n": 0}, unique=debounce)
        await app.enqueue("crm:sync", {"account": 2}, unique=durq.Unique(ttl=600))
        for n in range(1, 5):
            clock.advance(25)
            twin = await app.enqueue("crm:sync", {"account": 1, "n": n}, unique=debounce)
            assert twin.id == first.id
            (entry,) = [
                e for e in (await app.inspector.list_unique(Q)).entries if e.task_id == first.id
            ]
            assert entry.debounced and (entry.wait, entry.max_wait) == (30.0, 120.0)
            assert entry.latest == to_datetime(start + 120)
            assert entry.due == to_datetime(min(start + 25 * n + 30, start + 120))
            assert entry.state is TaskState.SCHEDULED and entry.until is None
        page = await app.inspector.list_unique(Q)
        assert page.total == 2
        plain = next(e for e in page.entries if e.task_id != first.id)
        assert not plain.debounced and plain.latest is None
        assert plain.until == to_datetime(start + 600)
    finally:
        await app.close()
