"""Dependencies on every broker: a task enqueued ``after=`` others waits, not claimable, and
is released in the same atomic step as the outcome of the last of them (completed, archived,
cancelled or deleted), exactly once however many workers finish them at once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from brokerkit import params

import durq
from conformance.apps import FAST
from conformance.conftest import requires
from conformance.test_broker_transactional import caller
from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import (
    CAP_CROSS_QUEUE_GROUPS,
    CAP_DEPENDENCIES,
    CAP_TRANSACTIONAL_ENQUEUE,
    ClaimParams,
    Lease,
)
from durq.clock import FakeClock
from durq.errors import ValidationError
from durq.states import TaskState


@pytest.fixture(autouse=True)
def _dependencies(broker: FullBroker) -> None:
    requires(broker, CAP_DEPENDENCIES)


async def _claim(broker: FullBroker, queue: str = "default", n: int = 10) -> list[Lease]:
    return await broker.claim(ClaimParams([queue], n, "w", 60))


async def _claim_ids(broker: FullBroker, queue: str = "default") -> set[str]:
    return {lease.task.id for lease in await _claim(broker, queue)}


async def _complete(broker: FullBroker, lease: Lease, retention: float = 0.0) -> bool:
    change = lifecycle.completed(lease, b'{"ok":1}', now=broker.clock.now())
    return await broker.complete(dataclasses.replace(change, retention=retention))


async def _state(app: durq.App, task_id: str, queue: str = "default") -> TaskState | None:
    try:
        return (await app.inspector.get_task_info(queue, task_id)).state
    except durq.TaskNotFoundError:
        return None


async def test_waits_until_its_last_dependency_completes(broker: FullBroker) -> None:
    app = durq.App(broker)
    a = await app.enqueue("job:a", {}, task_id="a")
    b = await app.enqueue("job:b", {}, task_id="b")
    w = await app.enqueue("job:w", {"n": 1}, task_id="w", after=[a, "b"])
    assert w.state is TaskState.WAITING
    stats = await app.inspector.queue_stats("default")
    assert stats.sizes[TaskState.WAITING] == 1 and stats.sizes[TaskState.PENDING] == 2
    listed = await app.inspector.list_tasks("default", TaskState.WAITING)
    assert [t.id for t in listed] == ["w"]

    leases = {lease.task.id: lease for lease in await _claim(broker)}
    assert set(leases) == {"a", "b"}  # the waiting task is not claimable
    assert await _complete(broker, leases["a"], retention=60)
    assert await _state(app, "w") is TaskState.WAITING
    assert await _claim_ids(broker) == set()
    assert await _complete(broker, leases["b"])  # retention 0: deleted on completion
    assert await _state(app, "w") is TaskState.PENDING
    (lease,) = await _claim(broker)
    assert lease.task.id == "w" and json.loads(lease.task.raw_payload) == {"n": 1}
    assert b.id == "b"


async def test_archived_cancelled_or_deleted_dependencies_count_as_finished(
    broker: FullBroker,
) -> None:
    app = durq.App(broker)
    for name in ("a1", "a2", "a3", "a4"):
        await app.enqueue("job:a", {}, task_id=name, process_in=3600 if name != "a1" else None)
    await app.enqueue("job:w", {}, task_id="w", after=["a1", "a2", "a3", "a4"])
    (lease,) = await _claim(broker)
    assert lease.task.id == "a1"
    # The worker gives up on a1 (archived), the inspector cancels a2, deletes a3, archives a4.
    assert await broker.archive(lifecycle.gave_up(lease, "boom", now=broker.clock.now()))
    assert await _state(app, "w") is TaskState.WAITING
    await app.inspector.cancel_task("default", "a2")
    await app.inspector.delete_task("default", "a3")
    assert await _state(app, "w") is TaskState.WAITING
    await app.inspector.archive_task("default", "a4")
    assert await _state(app, "w") is TaskState.PENDING


async def test_finished_or_missing_dependencies_count_as_done(broker: FullBroker) -> None:
    app = durq.App(broker)
    await app.enqueue("job:a", {}, task_id="done")
    (lease,) = await _claim(broker)
    assert await _complete(broker, lease, retention=60)
    await app.enqueue("job:f", {}, task_id="failed")
    (lease,) = await _claim(broker)
    assert await broker.archive(lifecycle.gave_up(lease, "boom", now=broker.clock.now()))
    info = await app.enqueue("job:w", {}, task_id="w", after=["done", "failed", "never-was"])
    assert info.state is TaskState.PENDING
    assert await _claim_ids(broker) == {"w"}
    # A delayed task whose dependencies have finished is scheduled as usual.
    later = await app.enqueue("job:w", {}, task_id="w2", after=["done"], process_in=60)
    assert later.state is TaskState.SCHEDULED


async def test_released_at_its_own_due_time(broker: FullBroker, clock: FakeClock) -> None:
    app = durq.App(broker)
    await app.enqueue("job:a", {}, task_id="a")
    await app.enqueue("job:w", {}, task_id="w", after=["a"], process_in=600)
    (lease,) = await _claim(broker)
    assert await _complete(broker, lease)
    assert await _state(app, "w") is TaskState.SCHEDULED
    assert await _claim_ids(broker) == set()
    clock.advance(601)
    assert await _claim_ids(broker) == {"w"}


async def test_cancel_and_delete_of_a_waiting_task(broker: FullBroker) -> None:
    app = durq.App(broker)
    await app.enqueue("job:a", {}, task_id="a")
    await app.enqueue("job:w", {}, task_id="w1", after=["a"])
    await app.enqueue("job:w", {}, task_id="w2", after=["a"])
    # A chain: c waits for w1, which waits for a.
    await app.enqueue("job:c", {}, task_id="c", after=["w1"])
    assert await _state(app, "c") is TaskState.WAITING
    cancelled = await app.inspector.cancel_task("default", "w1")
    assert cancelled.state is TaskState.ARCHIVED and cancelled.last_error == "cancelled"
    assert await _state(app, "c") is TaskState.PENDING  # w1 finished (archived)
    await app.inspector.delete_task("default", "w2")
    assert await _state(app, "w2") is None
    assert await _claim_ids(broker) == {"a", "c"}
    # The inspector does not run a waiting task: only its dependencies release it.
    await app.enqueue("job:a", {}, task_id="held", process_in=3600)
    await app.enqueue("job:w", {}, task_id="w3", after=["held"])
    with pytest.raises(durq.InvalidStateError):
        await app.inspector.run_task("default", "w3")


async def test_an_archived_dependency_run_again_counts_once(broker: FullBroker) -> None:
    app = durq.App(broker)
    await app.enqueue("job:a", {}, task_id="a")
    await app.enqueue("job:b", {}, task_id="b", process_in=3600)
    await app.enqueue("job:w", {}, task_id="w", after=["a", "b"])
    (lease,) = await _claim(broker)
    assert await broker.archive(lifecycle.gave_up(lease, "boom", now=broker.clock.now()))
    await app.inspector.run_task("default", "a")
    (lease,) = await _claim(broker)
    assert await _complete(broker, lease)
    assert await _state(app, "w") is TaskState.WAITING  # b has not finished
    await app.inspector.delete_task("default", "b")
    assert await _state(app, "w") is TaskState.PENDING


async def test_delete_all_releases_dependents(broker: FullBroker) -> None:
    app = durq.App(broker)
    for i in range(3):
        await app.enqueue("job:a", {"i": i}, task_id=f"a{i}", process_in=3600)
    await app.enqueue("job:w", {}, task_id="w", after=["a0", "a1", "a2"])
    assert await app.inspector.delete_all("default", TaskState.SCHEDULED) == 3
    assert await _state(app, "w") is TaskState.PENDING


async def test_concurrent_completions_release_once(
    broker: FullBroker, make_broker: Callable[..., Awaitable[FullBroker]]
) -> None:
    """Several workers complete and archive the dependencies of one task at once, many
    rounds: the task is released once, when the last of them finished."""
    workers = [broker, *[await make_broker() for _ in range(3)]]
    app = durq.App(broker)
    size = 8
    for round_ in range(5):
        deps = [await app.enqueue("d:x", {"i": i}, queue="fan") for i in range(size)]
        w = await app.enqueue("d:w", {"r": round_}, queue="fan", after=deps)
        assert w.state is TaskState.WAITING
        leases = await _claim(broker, "fan", size)
        assert len(leases) == size
        now = broker.clock.now()

        async def finish(i: int, lease: Lease) -> bool:
            worker = workers[i % len(workers)]
            if i % 3 == 0:
                return await worker.archive(lifecycle.gave_up(lease, "boom", now=now))
            return await worker.complete(lifecycle.completed(lease, b"1", now=now))

        assert all(await asyncio.gather(*(finish(i, x) for i, x in enumerate(leases))))
        (lease,) = await _claim(broker, "fan")
        assert lease.task.id == w.id, round_
        assert await _claim(broker, "fan") == []
        assert await _complete(broker, lease)


async def test_batched_completions_count_each_dependency(broker: FullBroker) -> None:
    app = durq.App(broker)
    for i in range(4):
        await app.enqueue("job:a", {"i": i}, task_id=f"a{i}")
    await app.enqueue("job:w", {}, task_id="w", after=["a0", "a1", "a2", "a3"])
    await app.enqueue("job:v", {}, task_id="v", after=["a0"])
    leases = await _claim(broker)
    now = broker.clock.now()
    first = [lifecycle.completed(x, b"1", now=now) for x in leases[:3]]
    assert await broker.complete_many(first) == [True] * 3
    assert await _state(app, "w") is TaskState.WAITING
    assert await _state(app, "v") is TaskState.PENDING
    assert await broker.complete_many([lifecycle.completed(leases[3], b"1", now=now)]) == [True]
    assert await _state(app, "w") is TaskState.PENDING


async def test_dependencies_in_another_queue(broker: FullBroker) -> None:
    app = durq.App(broker)
    a = await app.enqueue("job:a", {}, queue="other")
    if CAP_CROSS_QUEUE_GROUPS not in broker.capabilities:
        with pytest.raises(ValidationError):
            await app.enqueue("job:w", {}, after=[a])
        return
    w = await app.enqueue("job:w", {}, task_id="w", after=[a])
    assert w.state is TaskState.WAITING
    (lease,) = await _claim(broker, "other")
    assert await _complete(broker, lease)
    assert await _state(app, "w") is TaskState.PENDING


async def test_after_is_validated(broker: FullBroker) -> None:
    app = durq.App(broker)
    with pytest.raises(ValidationError):
        app.params(durq.EnqueueRequest("job:w", {}, after=[42]))
    with pytest.raises(ValidationError):
        app.params(durq.EnqueueRequest("job:w", {}, after=[f"t{i}" for i in range(1001)]))
    params = app.params(durq.EnqueueRequest("job:w", {}, after=["x", "x", "y"]))
    assert params.after == (("default", "x"), ("default", "y"))
    with pytest.raises(ValidationError):
        await app.enqueue_group([durq.EnqueueRequest("job:w", {}, after=["x"])])


async def test_a_worker_runs_the_dependent_after_its_dependencies(app: durq.App) -> None:
    requires(await app.broker(), CAP_DEPENDENCIES)
    order: list[str] = []

    @app.task("step:one")
    async def one(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.05 * payload["n"])
        order.append(f"one{payload['n']}")

    @app.task("step:two", retention=60)
    async def two(payload: dict[str, Any]) -> dict[str, Any]:
        order.append("two")
        return {"after": len(order) - 1}

    firsts = [await app.enqueue("step:one", {"n": n}) for n in range(3)]
    last = await app.enqueue("step:two", {}, after=firsts)
    async with app.worker(concurrency=4, **FAST):
        assert await app.wait(last, timeout=15) == {"after": 3}
    assert order[-1] == "two" and len(order) == 4


async def test_after_joins_the_callers_transaction(broker: FullBroker) -> None:
    requires(broker, CAP_TRANSACTIONAL_ENQUEUE)
    app = durq.App(broker)
    await app.enqueue("job:a", {}, task_id="a")
    await app.enqueue("job:w", {}, task_id="taken")
    w = params("w")
    async with caller(broker) as c:
        info = await broker.enqueue(
            dataclasses.replace(w, after=(("default", "a"),)), connection=c.conn
        )
        assert info.state is TaskState.WAITING
        await c.rollback()
    assert await _state(app, "w") is None
    async with caller(broker) as c:
        with pytest.raises(durq.TaskIDConflictError):  # undoes its own writes only
            await broker.enqueue(
                dataclasses.replace(params("taken"), after=(("default", "a"),)), connection=c.conn
            )
        await broker.enqueue(dataclasses.replace(w, after=(("default", "a"),)), connection=c.conn)
        await c.commit()
    assert await _state(app, "w") is TaskState.WAITING
    assert await _state(app, "taken") is TaskState.PENDING
    leases = {lease.task.id: lease for lease in await _claim(broker)}
    assert set(leases) == {"a", "taken"} and await _complete(broker, leases["a"])
    assert await _state(app, "w") is TaskState.PENDING
