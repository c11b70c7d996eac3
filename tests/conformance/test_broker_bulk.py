"""Bulk enqueue (E9): one call, one outcome per item, refusals never silent."""

from __future__ import annotations

from brokerkit import C, P, Q, S, params, picture, put, snapshot

from durq.brokers import FullBroker
from durq.clock import FakeClock
from durq.errors import DuplicateTaskError, TaskIDConflictError


async def test_E9_outcomes_per_item(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"taken": P, "done": C})
    await broker.enqueue(params("holder", unique_key="k", unique_ttl=60))
    items = [
        params("new1"),
        params("taken"),
        params("new2", process_at=clock.now() + 60),
        params("dup", unique_key="k", unique_ttl=60),
        params("done"),
        params("new3", "other"),
    ]
    outcomes = await broker.enqueue_many(items)
    assert [o.params.id for o in outcomes] == [p.id for p in items]
    assert [o.created for o in outcomes] == [True, False, True, False, False, True]
    assert outcomes[0].info is not None and outcomes[0].info.state is P
    assert outcomes[2].info is not None and outcomes[2].info.state is S
    assert isinstance(outcomes[1].error, TaskIDConflictError)
    assert outcomes[1].error.existing is not None and outcomes[1].error.existing.state is P
    assert isinstance(outcomes[3].error, DuplicateTaskError)
    assert outcomes[3].error.existing_id == "holder"
    assert isinstance(outcomes[4].error, TaskIDConflictError)
    assert all(o.info is None for o in outcomes if not o.created)
    assert await snapshot(broker) == picture(
        pending="taken holder new1", scheduled="new2", completed="done"
    )
    assert await snapshot(broker, "other") == picture(pending="new3")


async def test_E9_conflicts_inside_one_batch(broker: FullBroker) -> None:
    outcomes = await broker.enqueue_many(
        [
            params("a"),
            params("a", payload={"second": True}),
            params("u1", unique_key="k", unique_ttl=60),
            params("u2", unique_key="k", unique_ttl=60),
        ]
    )
    assert [o.created for o in outcomes] == [True, False, True, False]
    assert isinstance(outcomes[1].error, TaskIDConflictError)
    assert isinstance(outcomes[3].error, DuplicateTaskError)
    assert outcomes[3].error.existing_id == "u1"
    assert (await broker.admin.get_task("default", "a")).payload == {"id": "a"}


async def test_E9_id_conflicts_in_a_batch_without_unique_keys(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A batch without unique keys (which a broker may first send as a plain insert) reports
    each id conflict in its own outcome, reuses an id whose completed task has passed its
    retention, and creates every other task once."""
    await put(broker, clock, {"done": C}, retention=100)
    await put(broker, clock, {"old": C}, retention=10)
    await put(broker, clock, {"taken": P})
    clock.advance(10)  # "old" passed its retention; the janitor has not run
    items = [
        params("new1"),
        params("taken"),
        params("new2"),
        params("new2", payload={"second": True}),
        params("done"),
        params("old"),
    ]
    outcomes = await broker.enqueue_many(items)
    assert [o.params is p for o, p in zip(outcomes, items, strict=True)] == [True] * 6
    assert [o.created for o in outcomes] == [True, False, True, False, False, True]
    for refused in (outcomes[1], outcomes[3], outcomes[4]):
        assert isinstance(refused.error, TaskIDConflictError) and refused.info is None
    assert (await broker.admin.get_task(Q, "new2")).payload == {"id": "new2"}
    assert await snapshot(broker) == picture(pending="taken new1 new2 old", completed="done")


async def test_E9_empty_batch(broker: FullBroker) -> None:
    assert await broker.enqueue_many([]) == []


async def test_E9_large_batch(broker: FullBroker, clock: FakeClock) -> None:
    outcomes = await broker.enqueue_many([params(f"t{i:04}") for i in range(500)])
    assert all(o.created for o in outcomes)
    assert (await broker.admin.queue_stats("default")).sizes[P] == 500
