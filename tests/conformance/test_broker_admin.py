"""The inspector (I1-I5) through the Admin protocol: state tables for every action."""

from __future__ import annotations

import pytest
from brokerkit import A, C, P, R, S, X, claim, claim_ids, params, picture, put, snapshot

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import FORGET_WORKERS_AFTER, WorkerInfo
from durq.clock import FakeClock
from durq.errors import InvalidStateError, QueueNotFoundError, TaskNotFoundError
from durq.states import TaskState

ALL = {"p": P, "s": S, "a": A, "r": R, "x": X, "c": C}
BEFORE = picture(pending="p", scheduled="s", active="a", retry="r", archived="x", completed="c")


def moved(task_id: str, to: TaskState) -> dict[TaskState, list[str]]:
    """BEFORE with one task moved to another state (or deleted when ``to`` is None)."""
    groups = {state: [i for i in ids if i != task_id] for state, ids in BEFORE.items()}
    if to is not None:
        groups.setdefault(to, []).append(task_id)
    return {state: sorted(ids) for state, ids in groups.items() if ids}


@pytest.mark.parametrize(
    ("task_id", "after"), [("s", P), ("r", P), ("x", P), ("p", None), ("a", None), ("c", None)]
)
async def test_I3_run_task(
    broker: FullBroker, clock: FakeClock, task_id: str, after: TaskState | None
) -> None:
    await put(broker, clock, ALL)
    if after is None:
        with pytest.raises(InvalidStateError):
            await lifecycle.run_task(broker.admin, "default", task_id)
        assert await snapshot(broker) == BEFORE
        return
    info = await lifecycle.run_task(broker.admin, "default", task_id)
    assert info.state is P
    assert await snapshot(broker) == moved(task_id, P)
    assert sorted(await claim_ids(broker)) == sorted(["p", task_id])


async def test_I3_run_archived_keeps_its_history(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"x": X})
    info = await lifecycle.run_task(broker.admin, "default", "x")
    assert info.state is P and info.retried == 1 and info.last_error == "boom"
    assert await claim_ids(broker) == ["x"]


@pytest.mark.parametrize(
    ("task_id", "ok"),
    [("p", True), ("s", True), ("r", True), ("a", False), ("x", False), ("c", False)],
)
async def test_I3_archive_task(
    broker: FullBroker, clock: FakeClock, task_id: str, ok: bool
) -> None:
    await put(broker, clock, ALL)
    if not ok:
        with pytest.raises(InvalidStateError):
            await lifecycle.archive_task(broker.admin, "default", task_id)
        assert await snapshot(broker) == BEFORE
        return
    info = await lifecycle.archive_task(broker.admin, "default", task_id)
    assert info.state is X
    assert await snapshot(broker) == moved(task_id, X)


@pytest.mark.parametrize("task_id", ["p", "s", "r", "x", "c", "a"])
async def test_I3_delete_task(broker: FullBroker, clock: FakeClock, task_id: str) -> None:
    await put(broker, clock, ALL)
    if task_id == "a":
        with pytest.raises(InvalidStateError):
            await lifecycle.delete_task(broker.admin, "default", task_id)
        assert await snapshot(broker) == BEFORE
        return
    await lifecycle.delete_task(broker.admin, "default", task_id)
    assert await snapshot(broker) == moved(task_id, None)  # type: ignore[arg-type]
    with pytest.raises(TaskNotFoundError):
        await broker.admin.get_task("default", task_id)


@pytest.mark.parametrize("task_id", ["p", "s", "r"])
async def test_I3_cancel_waiting_task_archives_it(
    broker: FullBroker, clock: FakeClock, task_id: str
) -> None:
    await put(broker, clock, ALL)
    info = await lifecycle.cancel_task(broker.admin, "default", task_id)
    assert info.state is X and info.last_error == "cancelled"
    assert await snapshot(broker) == moved(task_id, X)


async def test_W12_cancel_active_flags_it(broker: FullBroker, clock: FakeClock) -> None:
    leases = await put(broker, clock, ALL)
    info = await lifecycle.cancel_task(broker.admin, "default", "a")
    assert info.state is A and info.cancel_requested
    assert await snapshot(broker) == BEFORE
    report = await broker.extend_leases([leases["a"].ref], 30)
    assert report.cancel == {"a"}


@pytest.mark.parametrize("task_id", ["x", "c"])
async def test_I3_cancel_finished_task_is_refused(
    broker: FullBroker, clock: FakeClock, task_id: str
) -> None:
    await put(broker, clock, ALL)
    with pytest.raises(InvalidStateError):
        await lifecycle.cancel_task(broker.admin, "default", task_id)
    assert await snapshot(broker) == BEFORE


@pytest.mark.parametrize(
    "action", ["get_task", "run_task", "archive_task", "delete_task", "cancel_task"]
)
async def test_I3_unknown_task(broker: FullBroker, clock: FakeClock, action: str) -> None:
    await put(broker, clock, {"p": P})
    # Reads go to the broker; moves through the lifecycle, which reads first.
    act = getattr(broker.admin, action) if action == "get_task" else getattr(lifecycle, action)
    with pytest.raises(TaskNotFoundError):
        await (
            act("default", "missing")
            if action == "get_task"
            else act(broker.admin, "default", "missing")
        )
    with pytest.raises(TaskNotFoundError):
        await (
            act("no-such-queue", "p")
            if action == "get_task"
            else act(broker.admin, "no-such-queue", "p")
        )


@pytest.mark.parametrize("state", [S, R, X])
async def test_I3_run_all(broker: FullBroker, clock: FakeClock, state: TaskState) -> None:
    await put(broker, clock, {**ALL, "s2": S, "r2": R, "x2": X})
    await put(broker, clock, {"elsewhere": X}, queue="other")
    ids = {S: "s s2", R: "r r2", X: "x x2"}[state]
    assert await lifecycle.run_all(broker.admin, "default", state) == 2
    expected = {k.value: " ".join(v) for k, v in BEFORE.items()}
    for other in (S, R, X):
        expected[other.value] = {S: "s s2", R: "r r2", X: "x x2"}[other]
    expected[state.value] = ""
    expected["pending"] = f"p {ids}"
    assert await snapshot(broker) == picture(**expected)
    assert await snapshot(broker, "other") == picture(archived="elsewhere")


@pytest.mark.parametrize("state", [P, S, R, X, C])
async def test_I3_delete_all(broker: FullBroker, clock: FakeClock, state: TaskState) -> None:
    await put(broker, clock, ALL)
    await put(broker, clock, {"elsewhere": state}, queue="other")
    assert await lifecycle.delete_all(broker.admin, "default", state) == 1
    expected = {k: v for k, v in BEFORE.items() if k is not state}
    assert await snapshot(broker) == expected
    assert await snapshot(broker, "other") == {state: ["elsewhere"]}


async def test_I3_delete_all_active_is_refused(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, ALL)
    with pytest.raises(InvalidStateError):
        await lifecycle.delete_all(broker.admin, "default", A)
    assert await snapshot(broker) == BEFORE


async def test_I2_list_tasks_pages_in_order(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(7):
        await broker.enqueue(params(f"t{i}"))
        clock.advance(1)
    page1 = await broker.admin.list_tasks("default", P, limit=3)
    page2 = await broker.admin.list_tasks("default", P, limit=3, offset=3)
    page3 = await broker.admin.list_tasks("default", P, limit=3, offset=6)
    assert [len(page1), len(page2), len(page3)] == [3, 3, 1]
    assert [t.id for t in page1 + page2 + page3] == [f"t{i}" for i in range(7)]
    assert await broker.admin.list_tasks("default", S) == []


async def test_I2_list_tasks_shows_fields(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"r": R}, max_retry=4)
    (task,) = await broker.admin.list_tasks("default", R)
    assert (task.id, task.state, task.retried, task.max_retry, task.last_error) == (
        "r",
        R,
        1,
        4,
        "boom",
    )


async def test_I2_unknown_queue(broker: FullBroker) -> None:
    with pytest.raises(QueueNotFoundError):
        await broker.admin.list_tasks("nope", P)
    with pytest.raises(QueueNotFoundError):
        await broker.admin.queue_stats("nope")
    with pytest.raises(QueueNotFoundError):
        await broker.admin.pause_queue("nope")
    with pytest.raises(QueueNotFoundError):
        await broker.admin.unpause_queue("nope")
    with pytest.raises(QueueNotFoundError):
        await lifecycle.run_all(broker.admin, "nope", X)
    with pytest.raises(QueueNotFoundError):
        await lifecycle.delete_all(broker.admin, "nope", X)
    assert "nope" not in {q.name for q in await broker.admin.list_queues()}


async def test_I1_list_queues_sizes_and_oldest(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {**ALL, "p2": P})
    await broker.enqueue(params("due-soon", process_at=clock.now() + 5))
    await broker.enqueue(params("other", "low"))
    clock.advance(42)
    queues = {q.name: q for q in await broker.admin.list_queues()}
    assert set(queues) == {"default", "low"}
    default = queues["default"]
    assert default.sizes == {P: 2, S: 2, A: 1, R: 1, X: 1, C: 1, TaskState.WAITING: 0}
    assert default.size == 8
    assert default.oldest_pending_age == pytest.approx(42)
    assert not default.paused
    assert default.to_dict()["sizes"]["pending"] == 2
    low = queues["low"]
    assert low.sizes == {P: 1, S: 0, A: 0, R: 0, X: 0, C: 0, TaskState.WAITING: 0}
    assert await broker.admin.queue_stats("low") == low


async def test_I1_oldest_pending_age_is_zero_when_nothing_waits(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"a": A, "s": S})
    clock.advance(100)
    assert (await broker.admin.queue_stats("default")).oldest_pending_age == 0


async def test_I1_completed_past_retention_not_counted(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"c": C}, retention=10)
    clock.advance(10)
    assert (await broker.admin.queue_stats("default")).sizes[C] == 0
    assert await snapshot(broker) == {}


async def test_I4_pause_and_unpause(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t"))
    await broker.admin.pause_queue("default")
    await broker.admin.pause_queue("default")  # idempotent
    assert (await broker.admin.queue_stats("default")).paused
    assert [q.paused for q in await broker.admin.list_queues()] == [True]
    assert await claim_ids(broker) == []
    await broker.admin.unpause_queue("default")
    assert not (await broker.admin.queue_stats("default")).paused
    assert await claim_ids(broker) == ["t"]


def worker(worker_id: str, clock: FakeClock, **changes: object) -> WorkerInfo:
    fields: dict[str, object] = {
        "id": worker_id,
        "host": "host-1",
        "pid": 4242,
        "queues": {"critical": 6, "default": 3},
        "concurrency": 10,
        "started_at": clock.now(),
    }
    fields.update(changes)
    return WorkerInfo(**fields)  # type: ignore[arg-type]


async def test_I5_workers_register_list_unregister(broker: FullBroker, clock: FakeClock) -> None:
    await broker.register_worker(worker("w1", clock))
    await broker.register_worker(worker("w2", clock, queues={"low": 1}, strict=True))
    listed = {w.id: w for w in await broker.admin.list_workers()}
    assert set(listed) == {"w1", "w2"}
    w1 = listed["w1"]
    assert (w1.host, w1.pid, w1.concurrency) == ("host-1", 4242, 10)
    assert w1.queues == {"critical": 6, "default": 3}
    assert w1.started_at == clock.now()
    assert w1.last_heartbeat == pytest.approx(clock.now())
    assert listed["w2"].strict
    # Its queues are known to the inspector even before anything is enqueued.
    assert {"critical", "default", "low"} <= {q.name for q in await broker.admin.list_queues()}
    await broker.unregister_worker("w2")
    assert [w.id for w in await broker.admin.list_workers()] == ["w1"]


async def test_I5_heartbeat_refreshes_and_silent_workers_disappear(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.register_worker(worker("w1", clock))
    await broker.register_worker(worker("w2", clock))
    clock.advance(45)
    await broker.register_worker(worker("w1", clock, started_at=clock.now() - 45, active=3))
    clock.advance(20)  # w2 silent for 65 s, w1 for 20 s
    (only,) = await broker.admin.list_workers()
    assert only.id == "w1" and only.active == 3
    assert only.last_heartbeat == pytest.approx(clock.now() - 20)


async def test_I5_a_worker_silent_for_a_day_is_forgotten_when_another_registers(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A worker killed without unregistering leaves its row; the next registration after
    FORGET_WORKERS_AFTER deletes it, so the registry does not grow with every restart. Seen
    through list_workers by stepping the clock back to just after the old heartbeat."""
    start = clock.now()
    await broker.register_worker(worker("gone", clock))
    await broker.register_worker(worker("kept", clock))
    clock.advance(FORGET_WORKERS_AFTER - 10)
    await broker.register_worker(worker("kept", clock))
    clock.advance(20)  # "gone" silent for FORGET_WORKERS_AFTER + 10 s, "kept" for 20 s
    await broker.register_worker(worker("new", clock))
    clock.set(start + 1)
    # Every heartbeat since is in the future; only the forgotten worker's row is not.
    assert {w.id for w in await broker.admin.list_workers()} == {"kept", "new"}


async def test_I3_pause_is_per_queue(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"a": P})
    await put(broker, clock, {"b": P}, queue="other")
    await broker.admin.pause_queue("other")
    assert await claim_ids(broker, ["default", "other"]) == ["a"]
    assert [lease.task.id for lease in await claim(broker, "other")] == []
