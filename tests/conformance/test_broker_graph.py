"""``enqueue_graph`` on every broker (W20): a workflow's tasks are created all or none, each waiting
for the earlier tasks it names, and released by the same countdown as ``after=`` (the last
dependency's outcome makes it claimable in that same atomic step)."""

from __future__ import annotations

import itertools

import pytest
from brokerkit import claim, claim_ids, params, put, snapshot

import durq
from conformance.conftest import requires
from durq.brokers import FullBroker
from durq.brokers.base import (
    CAP_DEPENDENCIES,
    ArchiveParams,
    CompleteParams,
    EnqueueParams,
)
from durq.clock import FakeClock
from durq.errors import DuplicateTaskError, TaskIDConflictError
from durq.states import TaskState

P, W, C = TaskState.PENDING, TaskState.WAITING, TaskState.COMPLETED


@pytest.fixture(autouse=True)
def _dependencies(broker: FullBroker) -> None:
    requires(broker, CAP_DEPENDENCIES)


def node(task_id: str, *after: str, **options: object) -> EnqueueParams:
    return params(task_id, after=tuple(("default", a) for a in after), **options)


async def finish(broker: FullBroker, expected: list[str], *, archive: str = "") -> None:
    """Claim exactly ``expected`` and complete them (archive the one named ``archive``)."""
    leases = await claim(broker, limit=100)
    assert sorted(lease.task.id for lease in leases) == sorted(expected)
    for lease in leases:
        if lease.task.id == archive:
            assert await broker.archive(ArchiveParams(lease.ref, "boom"))
        else:
            assert await broker.complete(CompleteParams(lease.ref, b'"ok"', 60.0))


async def test_a_diamond_runs_in_dependency_order(broker: FullBroker) -> None:
    infos = await broker.enqueue_graph(
        [node("a"), node("b", "a"), node("c", "a"), node("d", "b", "c", "a")]
    )
    assert [i.state for i in infos] == [P, W, W, W]
    assert await snapshot(broker) == {P: ["a"], W: ["b", "c", "d"]}
    await finish(broker, ["a"])
    await finish(broker, ["b", "c"])
    await finish(broker, ["d"])
    assert await snapshot(broker) == {C: ["a", "b", "c", "d"]}


async def test_an_archived_dependency_releases_its_dependents_too(broker: FullBroker) -> None:
    await broker.enqueue_graph([node("a"), node("b", "a"), node("c", "b")])
    await finish(broker, ["a"], archive="a")
    await finish(broker, ["b"])
    await finish(broker, ["c"])


async def test_a_deep_chain_is_released_one_link_at_a_time(broker: FullBroker) -> None:
    ids = [f"n{i:03d}" for i in range(200)]
    await broker.enqueue_graph([node(ids[0]), *(node(b, a) for a, b in itertools.pairwise(ids))])
    for task_id in ids:
        await finish(broker, [task_id])
    assert await claim_ids(broker) == []


async def test_a_wide_fan_out_and_fan_in(broker: FullBroker) -> None:
    leaves = [f"leaf{i:04d}" for i in range(1000)]
    infos = await broker.enqueue_graph(
        [node("root"), *(node(leaf, "root") for leaf in leaves), node("merge", *leaves)]
    )
    assert len(infos) == 1002
    await finish(broker, ["root"])
    released = 0
    while released < len(leaves):
        leases = await claim(broker, limit=100)
        assert leases and all(lease.task.id.startswith("leaf") for lease in leases)
        for lease in leases:
            assert await broker.complete(CompleteParams(lease.ref, b'"ok"', 60.0))
        released += len(leases)
    await finish(broker, ["merge"])


@pytest.mark.parametrize(
    ("taken", "error"),
    [("id", TaskIDConflictError), ("unique", DuplicateTaskError)],
)
async def test_one_refused_task_creates_nothing(
    broker: FullBroker, clock: FakeClock, taken: str, error: type[Exception]
) -> None:
    if taken == "id":
        await put(broker, clock, {"c": TaskState.SCHEDULED})
        last = node("c", "a")
    else:
        holder = params("holder", unique_key="k", unique_ttl=600.0, process_at=clock.now() + 600)
        await broker.enqueue(holder)
        last = node("c", "a", unique_key="k", unique_ttl=600.0)
    before = await snapshot(broker)
    with pytest.raises(error):
        await broker.enqueue_graph([node("a"), node("b", "a"), last])
    assert await snapshot(broker) == before
    # Nothing half-written: the same graph under free ids is created and runs.
    await broker.enqueue_graph([node("a"), node("b", "a"), node("c2", "a", "b")])
    await finish(broker, ["a"])
    await finish(broker, ["b"])
    await finish(broker, ["c2"])


@pytest.mark.parametrize("twice", ["id", "unique", "id of a unique task"])
async def test_two_tasks_of_one_graph_that_collide_create_nothing(
    broker: FullBroker, clock: FakeClock, twice: str
) -> None:
    await put(broker, clock, {"other": TaskState.SCHEDULED})
    u = {"unique_key": "k", "unique_ttl": 600.0}
    if twice == "id":
        items, error = [node("a"), node("b", "a"), node("b")], TaskIDConflictError
    elif twice == "id of a unique task":
        items, error = [node("a", **u), node("a")], TaskIDConflictError
    else:
        items, error = [node("a", **u), node("b", "a", **u)], DuplicateTaskError
    with pytest.raises(error):
        await broker.enqueue_graph(items)
    assert await snapshot(broker) == {TaskState.SCHEDULED: ["other"]}


async def test_cancelling_a_waiting_node_counts_as_its_outcome(broker: FullBroker) -> None:
    await broker.enqueue_graph([node("a"), node("b", "a"), node("c", "b")])
    await durq.App(broker).inspector.cancel_task("default", "b")
    # b's outcome counts for c at once: c runs beside a, b never runs.
    await finish(broker, ["a", "c"])
    assert await claim_ids(broker) == []
