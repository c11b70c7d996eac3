"""Scoped uniqueness (``durq.Unique``) on every broker: twins by chosen payload fields, by
time bucket, and an enqueue of a twin that returns it instead of raising. The broker refuses
a twin atomically with the insert, as for ``unique=ttl`` (E4), so 200 concurrent enqueues of
twins create one task."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from brokerkit import LATER, LEASE, Q, claim, params

import durq
from durq.brokers import FullBroker
from durq.brokers.base import (
    ClaimParams,
    CompleteParams,
    EnqueueParams,
    TwinReplace,
    UniqueRelease,
)
from durq.clock import FakeClock
from durq.errors import ValidationError
from durq.states import TaskState

SYNC = durq.Unique(keys=["account_id"])


@pytest.fixture
async def clocked(broker_url: str, clock: FakeClock) -> AsyncIterator[durq.App]:
    """An App whose clock (and its brokers') the test moves."""
    application = durq.App(broker_url, clock=clock)
    migrator = application.new_broker()
    await migrator.migrate()
    await migrator.close()
    yield application
    await application.close()


async def test_E4_twins_by_chosen_fields(app: durq.App) -> None:
    first = await app.enqueue("crm:sync", {"account_id": 7, "reason": "edit"}, unique=SYNC)
    with pytest.raises(durq.DuplicateTaskError) as refused:
        await app.enqueue("crm:sync", {"account_id": 7, "reason": "import"}, unique=SYNC)
    assert refused.value.existing_id == first.id
    # Another account, another type or another queue is no twin.
    await app.enqueue("crm:sync", {"account_id": 8, "reason": "edit"}, unique=SYNC)
    await app.enqueue("crm:other", {"account_id": 7}, unique=SYNC)
    await app.enqueue("crm:sync", {"account_id": 7}, unique=SYNC, queue="other")
    # Without the option the same payload is just another task.
    await app.enqueue("crm:sync", {"account_id": 7, "reason": "edit"})


async def test_E4_dotted_paths_and_missing_fields(app: durq.App) -> None:
    by_owner = durq.Unique(keys=["owner.id", "tags.0"])
    await app.enqueue("x:y", {"owner": {"id": 1, "name": "a"}, "tags": ["t", "u"]}, unique=by_owner)
    with pytest.raises(durq.DuplicateTaskError):
        await app.enqueue("x:y", {"owner": {"id": 1, "name": "b"}, "tags": ["t"]}, unique=by_owner)
    # A missing field counts as null: two payloads without it are twins.
    await app.enqueue("x:y", {"tags": ["t"]}, unique=by_owner)
    with pytest.raises(durq.DuplicateTaskError):
        await app.enqueue("x:y", {"owner": None, "tags": ["t"], "more": 1}, unique=by_owner)


async def test_E4_a_twin_holds_the_key_until_it_finishes(app: durq.App) -> None:
    @app.task("crm:sync", unique=SYNC, retention=60)
    async def sync(payload: dict[str, Any]) -> int:
        return int(payload["account_id"])

    first = await sync.enqueue({"account_id": 3})
    with pytest.raises(durq.DuplicateTaskError):
        await sync.enqueue({"account_id": 3})
    async with app.worker(concurrency=2, poll_interval=0.05):
        assert await app.wait(first, timeout=20) == 3
    # Finished (completed): the key is free again.
    again = await sync.enqueue({"account_id": 3})
    assert again.id != first.id


async def test_E4_on_conflict_return_hands_back_the_twin(app: durq.App) -> None:
    once = durq.Unique(keys=["account_id"], on_conflict="return")
    first = await app.enqueue("crm:sync", {"account_id": 1, "n": 1}, unique=once)
    twin = await app.enqueue("crm:sync", {"account_id": 1, "n": 2}, unique=once)
    assert twin.id == first.id and twin.state is TaskState.PENDING
    assert twin.payload == {"account_id": 1, "n": 1}  # the twin as stored, not replaced
    # The task type's option works the same way, and the sync face too.
    app.task("crm:pull", unique=once)(lambda payload: None)
    pulled = await app.enqueue("crm:pull", {"account_id": 1})
    assert app.enqueue_sync is not None
    assert (await app.enqueue("crm:pull", {"account_id": 1})).id == pulled.id


async def test_E4_period_buckets_twins_by_time(clocked: durq.App, clock: FakeClock) -> None:
    hourly = durq.Unique(keys=["report"], period="1h")
    start = clock.now()
    clock.advance(3600 - start % 3600 + 10)  # 10 s into an hour
    await clocked.enqueue("report:build", {"report": "sales"}, unique=hourly)
    clock.advance(3000)  # the same hour
    with pytest.raises(durq.DuplicateTaskError):
        await clocked.enqueue("report:build", {"report": "sales"}, unique=hourly)
    clock.advance(600)  # the next hour: another bucket, and the first key's time is over
    await clocked.enqueue("report:build", {"report": "sales"}, unique=hourly)
    with pytest.raises(durq.DuplicateTaskError):
        await clocked.enqueue("report:build", {"report": "sales"}, unique=hourly)


async def test_E4_ttl_bounds_a_scoped_key(clocked: durq.App, clock: FakeClock) -> None:
    short = durq.Unique(keys=["account_id"], ttl=60)
    await clocked.enqueue("crm:sync", {"account_id": 1}, unique=short)
    clock.advance(30)
    with pytest.raises(durq.DuplicateTaskError):
        await clocked.enqueue("crm:sync", {"account_id": 1}, unique=short)
    clock.advance(31)
    await clocked.enqueue("crm:sync", {"account_id": 1}, unique=short)


async def test_E4_concurrent_twins_create_one_task(app: durq.App) -> None:
    once = durq.Unique(keys=["account_id"], on_conflict="return")
    infos = await asyncio.gather(
        *(app.enqueue("crm:sync", {"account_id": 42, "n": n}, unique=once) for n in range(200))
    )
    assert len({info.id for info in infos}) == 1
    stored = await app.inspector.list_tasks("default", TaskState.PENDING, limit=500)
    assert [t.id for t in stored] == [infos[0].id]


@pytest.mark.parametrize("broker_kind", ["memory"], indirect=True)
async def test_E4_bad_unique_options_are_refused(broker_kind: str) -> None:
    for bad in (
        lambda: durq.Unique(keys="account_id"),
        lambda: durq.Unique(keys=["a..b"]),
        lambda: durq.Unique(keys=["a", "a"]),
        lambda: durq.Unique(period=0),
        lambda: durq.Unique(on_conflict="replace!"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValidationError):
            bad()
    app = durq.App("memory://")
    with pytest.raises(ValidationError):
        await app.enqueue("x:y", {}, unique=object())  # type: ignore[arg-type]
    await app.close()


# -- the storage steps: free a twin's key, replace a waiting twin -------------------------


def keyed(task_id: str, key: str, payload: dict[str, Any], **options: Any) -> EnqueueParams:
    return params(task_id, payload=payload, unique_key=key, unique_ttl=LATER, **options)


async def test_E4_free_unique_is_fenced_by_key_and_state(broker: FullBroker) -> None:
    await broker.enqueue(keyed("a", "k1", {"n": 1}))
    scheduled = (TaskState.SCHEDULED,)
    started = (TaskState.ACTIVE,)
    # Pending: not a state that lets the key go; a wrong key frees nothing either.
    assert not await broker.free_unique(UniqueRelease(Q, "a", "k1", started))
    assert not await broker.free_unique(UniqueRelease(Q, "a", "other", (TaskState.PENDING,)))
    with pytest.raises(durq.DuplicateTaskError):
        await broker.enqueue(keyed("b", "k1", {"n": 2}))
    (lease,) = await claim(broker)
    assert not await broker.free_unique(UniqueRelease(Q, "a", "k1", scheduled))
    assert await broker.free_unique(UniqueRelease(Q, "a", "k1", started))
    # Freed once: the running task keeps running; a twin may be enqueued.
    assert not await broker.free_unique(UniqueRelease(Q, "a", "k1", started))
    await broker.enqueue(keyed("b", "k1", {"n": 2}))
    # The first task's end does not free the key the second one holds now.
    assert await broker.complete(CompleteParams(lease.ref, retention=60))
    with pytest.raises(durq.DuplicateTaskError) as refused:
        await broker.enqueue(keyed("c", "k1", {"n": 3}))
    assert refused.value.existing_id == "b"


async def test_E4_replace_twin_changes_a_waiting_twin_only(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(keyed("s", "ks", {"v": 1}, process_in=100, priority=1))
    await broker.enqueue(keyed("p", "kp", {"v": 1}))
    start = clock.now()
    clock.advance(10)
    done = await broker.replace_twin(
        TwinReplace(Q, "s", "ks", b'{"v":2}', delay=30, within=35, priority=5)
    )
    assert done is not None and done.payload == {"v": 2} and done.priority == 5
    assert done.next_process_at is not None
    # 30 s from now would be 40 s after its enqueue: held to 35.
    assert abs(done.next_process_at.timestamp() - (start + 35)) < 0.01
    # A pending twin takes the payload; its due time and priority stay.
    kept = await broker.replace_twin(TwinReplace(Q, "p", "kp", b'{"v":3}', delay=60, priority=9))
    assert kept is not None and kept.payload == {"v": 3} and kept.priority == 0
    assert kept.state is TaskState.PENDING
    # A wrong key, or a twin that runs, is left as it is.
    assert await broker.replace_twin(TwinReplace(Q, "p", "nope", b"{}")) is None
    (lease,) = await claim(broker)
    assert lease.task.id == "p" and lease.task.payload == {"v": 3}
    assert await broker.replace_twin(TwinReplace(Q, "p", "kp", b'{"v":4}')) is None
    got = await broker.admin.get_task(Q, "p")
    assert got.payload == {"v": 3} and got.state is TaskState.ACTIVE
    # The moved due time is the one a claim honours.
    clock.advance(24)
    assert await claim(broker) == []
    clock.advance(2)
    (later,) = await claim(broker)
    assert later.task.id == "s" and later.task.payload == {"v": 2}


# -- Unique(states=..., on_conflict="replace") and durq.Debounce through the app ----------


async def test_E4_states_let_a_twin_in_once_the_first_started(app: durq.App) -> None:
    queued = durq.Unique(keys=["account_id"], states=("pending", "scheduled", "retry"))
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task("crm:sync", unique=queued, retention=60)
    async def sync(payload: dict[str, Any]) -> int:
        started.set()
        await release.wait()
        return int(payload["n"])

    first = await sync.enqueue({"account_id": 1, "n": 1})
    with pytest.raises(durq.DuplicateTaskError):
        await sync.enqueue({"account_id": 1, "n": 2})
    async with app.worker(concurrency=1, poll_interval=0.05):
        await asyncio.wait_for(started.wait(), 20)
        # The first runs: one more may queue behind it, and only one.
        second = await sync.enqueue({"account_id": 1, "n": 3})
        assert second.id != first.id
        with pytest.raises(durq.DuplicateTaskError) as refused:
            await sync.enqueue({"account_id": 1, "n": 4})
        assert refused.value.existing_id == second.id
        release.set()
        assert await app.wait(second, timeout=20) == 3
    assert await app.wait(first, timeout=20) == 1


async def test_E4_replace_updates_the_waiting_twin(app: durq.App) -> None:
    latest = durq.Unique(keys=["account_id"], on_conflict="replace")
    first = await app.enqueue("crm:sync", {"account_id": 1, "v": 1}, unique=latest, process_in=60)
    again = await app.enqueue(
        "crm:sync", {"account_id": 1, "v": 2}, unique=latest, process_in=600, priority=7
    )
    assert again.id == first.id and again.payload == {"account_id": 1, "v": 2}
    assert again.priority == 7 and again.next_process_at is not None
    assert again.next_process_at.timestamp() > time.time() + 500
    stored = await app.inspector.get_task_info("default", first.id)
    assert stored.payload == {"account_id": 1, "v": 2}


async def test_E4_replace_never_changes_a_running_twin(app: durq.App) -> None:
    latest = durq.Unique(keys=["account_id"], on_conflict="replace")
    started, release = asyncio.Event(), asyncio.Event()

    @app.task("crm:sync", unique=latest, retention=60)
    async def sync(payload: dict[str, Any]) -> Any:
        started.set()
        await release.wait()
        return payload["v"]

    first = await sync.enqueue({"account_id": 1, "v": 1})
    async with app.worker(concurrency=1, poll_interval=0.05):
        await asyncio.wait_for(started.wait(), 20)
        with pytest.raises(durq.DuplicateTaskError):
            await sync.enqueue({"account_id": 1, "v": 2})
        release.set()
        assert await app.wait(first, timeout=20) == 1


async def test_E4_debounce_collapses_a_burst_into_one_late_task(
    clocked: durq.App, clock: FakeClock
) -> None:
    burst = durq.Debounce("doc_id", wait="5s", max_wait="12s")
    first = await clocked.enqueue("doc:index", {"doc_id": 9, "rev": 0}, unique=burst)
    start = clock.now()
    assert first.state is TaskState.SCHEDULED
    for rev in range(1, 6):  # every 2 s: each pushes the run to 5 s after it, up to 12 s
        clock.advance(2)
        info = await clocked.enqueue("doc:index", {"doc_id": 9, "rev": rev}, unique=burst)
        assert info.id == first.id and info.payload == {"doc_id": 9, "rev": rev}
        assert info.next_process_at is not None
        expected = min(clock.now() + 5, start + 12)
        assert abs(info.next_process_at.timestamp() - expected) < 0.01
    # Another document is debounced apart.
    other = await clocked.enqueue("doc:index", {"doc_id": 10, "rev": 0}, unique=burst)
    assert other.id != first.id
    stored = await clocked.inspector.list_tasks("default", TaskState.SCHEDULED, limit=10)
    assert sorted(t.id for t in stored) == sorted([first.id, other.id])


@pytest.mark.parametrize("broker_kind", ["memory"], indirect=True)
async def test_E4_bad_debounce_and_states_are_refused(broker_kind: str) -> None:
    for bad in (
        lambda: durq.Debounce("doc_id", wait=0),
        lambda: durq.Debounce("doc_id", wait="10s", max_wait="5s"),
        lambda: durq.Unique(states=("completed",)),
        lambda: durq.Unique(states=()),
        lambda: durq.Unique(states="pending"),  # type: ignore[arg-type]
        lambda: durq.Unique(states=("nope",)),
    ):
        with pytest.raises(ValidationError):
            bad()


async def test_E4_a_task_shows_the_unique_key_it_holds(app: durq.App) -> None:
    """The inspector shows until when a task holds its key: a ttl, or until it finishes;
    a task without one, or one that let it go, shows none."""
    timed = await app.enqueue("x:y", {"a": 1}, unique=600)
    forever = await app.enqueue("x:y", {"a": 2}, unique=durq.Unique(keys=["a"]))
    plain = await app.enqueue("x:y", {"a": 3})
    got = {
        i.id: await app.inspector.get_task_info("default", i.id) for i in (timed, forever, plain)
    }
    until, enqueued = got[timed.id].unique_until, got[timed.id].enqueued_at
    # From the broker's clock at the enqueue, however long the test then took.
    assert until is not None and enqueued is not None
    assert abs((until - enqueued).total_seconds() - 600) < 0.01
    assert got[timed.id].to_dict()["unique_until"] is not None
    assert (got[timed.id].describe_unique() or "").startswith("held until 20")
    assert got[forever.id].describe_unique() == "held until it finishes (twins are refused)"
    assert got[plain.id].unique_until is None and got[plain.id].describe_unique() is None
    # A twin that started lets its key go (states without active): it shows none then.
    queued = durq.Unique(keys=["b"], states=("pending",))
    first = await app.enqueue("x:z", {"b": 1}, unique=queued)
    broker = await app.broker()
    await broker.claim(ClaimParams(["default"], 10, "w1", LEASE))
    second = await app.enqueue("x:z", {"b": 1}, unique=queued)
    assert second.id != first.id
    released = await app.inspector.get_task_info("default", first.id)
    assert released.unique_until is None and released.describe_unique() is None


async def test_E4_a_key_taken_by_a_later_twin_is_no_longer_the_first_ones(
    broker: FullBroker, clock: FakeClock
) -> None:
    """Past its ttl a key goes to the next twin: the first task can neither let it go nor
    be replaced through it any more."""
    await broker.enqueue(params("a", payload={"n": 1}, unique_key="k", unique_ttl=10))
    clock.advance(11)
    await broker.enqueue(params("b", payload={"n": 2}, unique_key="k", unique_ttl=10))
    everywhere = (TaskState.PENDING, TaskState.SCHEDULED)
    assert await broker.replace_twin(TwinReplace(Q, "a", "k", b'{"n":3}')) is None
    assert not await broker.free_unique(UniqueRelease(Q, "a", "k", everywhere))
    assert (await broker.admin.get_task(Q, "a")).payload == {"n": 1}
    changed = await broker.replace_twin(TwinReplace(Q, "b", "k", b'{"n":4}'))
    assert changed is not None and changed.payload == {"n": 4}
    assert await broker.free_unique(UniqueRelease(Q, "b", "k", everywhere))


async def test_E4_a_queue_counts_the_unique_keys_its_tasks_hold(
    clocked: durq.App, clock: FakeClock
) -> None:
    """The inspector's queue figures (and ``durq_queue_unique_keys``) count the keys held
    now: not a task without one, not a key whose ttl passed, not one let go at the end."""
    await clocked.enqueue("crm:sync", {"account_id": 1}, unique=SYNC)
    await clocked.enqueue("crm:sync", {"account_id": 2}, unique=durq.Unique(["account_id"], ttl=60))
    await clocked.enqueue("crm:sync", {"account_id": 3})
    await clocked.enqueue("crm:sync", {"account_id": 4}, unique=SYNC, queue="other")
    stats = await clocked.inspector.queue_stats("default")
    assert stats.unique_keys == 2 and stats.to_dict()["unique_keys"] == 2
    clock.advance(61)  # the second key's ttl passed: it holds no more
    assert (await clocked.inspector.queue_stats("default")).unique_keys == 1
    broker = await clocked.broker()
    (lease,) = await broker.claim(ClaimParams(["other"], 1, "w1", LEASE))
    await broker.complete(CompleteParams(lease.ref, None, 60))
    assert (await clocked.inspector.queue_stats("other")).unique_keys == 0
    listed = {q.name: q.unique_keys for q in await clocked.inspector.list_queues()}
    assert listed == {"default": 1, "other": 0}
