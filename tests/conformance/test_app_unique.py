"""Scoped uniqueness (``durq.Unique``) on every broker: twins by chosen payload fields, by
time bucket, and an enqueue of a twin that returns it instead of raising. The broker refuses
a twin atomically with the insert, as for ``unique=ttl`` (E4), so 200 concurrent enqueues of
twins create one task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import durq
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
