"""Enqueue through the App on every broker: E1-E7, E9, E10."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pydantic
import pytest

import durq
from durq.brokers import open_broker
from durq.errors import ConfigurationError
from durq.states import TaskState


async def test_E1_enqueue_returns_task_info(app: durq.App) -> None:
    info = await app.enqueue("email:send", {"to": "a@b.c"}, queue="mail", max_retry=3, timeout=10)
    assert info.queue == "mail" and info.type == "email:send"
    assert info.payload == {"to": "a@b.c"}
    assert info.state is TaskState.PENDING
    assert (info.max_retry, info.retried, info.last_error) == (3, 0, None)
    assert info.timeout == 10
    assert info.enqueued_at is not None and info.completed_at is None and info.result is None
    again = await app.inspector.get_task_info("mail", info.id)
    assert again.payload == info.payload and again.state is TaskState.PENDING


async def test_E2_delay_lives_in_the_broker(app: durq.App, broker_url: str) -> None:
    info = await app.enqueue("report:build", {}, process_in=timedelta(hours=1))
    assert info.state is TaskState.SCHEDULED
    assert info.next_process_at is not None
    assert info.next_process_at > datetime.now(UTC) + timedelta(minutes=59)
    at = datetime.now(UTC) + timedelta(days=1)
    other = await app.enqueue("report:build", {}, process_at=at)
    assert other.state is TaskState.SCHEDULED
    # A fresh process (a new app and broker) sees the same schedule: nothing in memory.
    fresh = durq.App(broker_url)
    try:
        seen = await fresh.inspector.get_task_info("default", other.id)
        assert seen.state is TaskState.SCHEDULED
        assert seen.next_process_at is not None
        assert abs(seen.next_process_at.timestamp() - at.timestamp()) < 0.01
    finally:
        await fresh.close()


async def test_E2_process_in_and_process_at_together_is_an_error(app: durq.App) -> None:
    with pytest.raises(durq.DurqError):
        await app.enqueue("x:y", {}, process_in=5, process_at=time.time() + 5)


async def test_E3_task_id_conflict_carries_existing_and_changes_nothing(app: durq.App) -> None:
    first = await app.enqueue("payment:charge", {"amount": 1}, task_id="order-1")
    with pytest.raises(durq.TaskIDConflictError) as caught:
        await app.enqueue("payment:charge", {"amount": 999}, task_id="order-1")
    assert caught.value.existing is not None
    assert caught.value.existing.id == "order-1"
    assert caught.value.existing.state is TaskState.PENDING
    stored = await app.inspector.get_task_info("default", "order-1")
    assert stored.payload == {"amount": 1} and stored.enqueued_at == first.enqueued_at
    # Same id in another queue is another task.
    await app.enqueue("payment:charge", {"amount": 1}, task_id="order-1", queue="other")


async def test_E4_unique_refuses_identical_task_within_ttl(app: durq.App) -> None:
    await app.enqueue("mail:digest", {"user": 1, "day": "mon"}, unique=3600)
    with pytest.raises(durq.DuplicateTaskError):
        # Same content, keys in another order: canonical JSON makes it the same task.
        await app.enqueue("mail:digest", {"day": "mon", "user": 1}, unique=3600)
    await app.enqueue("mail:digest", {"user": 2, "day": "mon"}, unique=3600)
    await app.enqueue("mail:digest", {"user": 1, "day": "mon"}, unique=3600, queue="other")


async def test_E4_unique_ttl_passes(app: durq.App) -> None:
    await app.enqueue("mail:digest", {"user": 1}, unique=0.3)
    await asyncio.sleep(0.4)
    await app.enqueue("mail:digest", {"user": 1}, unique=0.3)


async def test_E5_options_are_stored(app: durq.App) -> None:
    deadline = datetime.now(UTC) + timedelta(hours=2)
    info = await app.enqueue(
        "x:y", {}, max_retry=7, timeout="90s", deadline=deadline, retention="1h"
    )
    stored = await app.inspector.get_task_info("default", info.id)
    assert stored.max_retry == 7 and stored.timeout == 90 and stored.retention == 3600
    assert stored.deadline is not None
    assert abs(stored.deadline.timestamp() - deadline.timestamp()) < 0.01
    default = await app.enqueue("x:y", {})
    assert default.max_retry == 25 and default.retention == 3600  # an hour unless set
    kept_nothing = await app.enqueue("x:y", {}, retention=0)
    assert kept_nothing.retention == 0


async def test_E5_the_plain_call_stores_what_the_general_path_stores(app: durq.App) -> None:
    @app.task("report:tuned", queue="reports", max_retry=4, timeout=30, retention=60, priority=5)
    async def tuned(payload: dict[str, object]) -> None: ...

    for task_type in ("report:tuned", "report:unregistered"):
        # No option: the plain path. An option equal to its default: the general path.
        plain = await app.enqueue(task_type, {"b": [1, "é"], "a": None})
        general = await app.enqueue(task_type, {"b": [1, "é"], "a": None}, headers={})
        assert plain.id != general.id
        for info in (plain, general):
            stored = await app.inspector.get_task_info(info.queue, info.id)
            assert stored.enqueued_at == info.enqueued_at
            assert stored.next_process_at == info.next_process_at
        one, other = [
            dataclasses.replace(
                await app.inspector.get_task_info(info.queue, info.id),
                id="",
                enqueued_at=None,
                next_process_at=None,
            )
            for info in (plain, general)
        ]
        assert one == other
        assert one.state is TaskState.PENDING and one.raw_payload == other.raw_payload


@dataclasses.dataclass
class SendEmail:
    to: str
    subject: str = "hi"


class Charge(pydantic.BaseModel):
    amount: int
    currency: str


class Ping(msgspec.Struct):
    host: str


async def test_E6_payload_errors_before_the_broker_is_touched(app: durq.App) -> None:
    for bad in ([1, 2], "text", {"x": object()}, {"x": float("nan")}):
        with pytest.raises(durq.PayloadError):
            await app.enqueue("x:y", bad)
    with pytest.raises(durq.PayloadError):
        await app.enqueue("x:y", {"blob": "a" * (1024 * 1024 + 1)})
    small = durq.App(app.broker_url, max_payload=100)
    with pytest.raises(durq.PayloadError):
        await small.enqueue("x:y", {"blob": "a" * 200})
    for queue in await app.inspector.list_queues():
        assert queue.size == 0


async def test_E6_typed_payloads_are_validated_at_enqueue(app: durq.App) -> None:
    @app.task("email:send")
    async def send(payload: SendEmail) -> None: ...

    @app.task("payment:charge")
    async def charge(payload: Charge) -> None: ...

    @app.task("net:ping")
    async def ping(payload: Ping) -> None: ...

    info = await send.enqueue(SendEmail(to="a@b.c"))
    assert info.payload == {"to": "a@b.c", "subject": "hi"}
    assert (await charge.enqueue({"amount": 5, "currency": "EUR"})).payload["amount"] == 5
    assert (await ping.enqueue(Ping(host="h"))).payload == {"host": "h"}
    with pytest.raises(durq.PayloadError):
        await send.enqueue({"subject": "no recipient"})
    with pytest.raises(durq.PayloadError):
        await charge.enqueue({"amount": "lots", "currency": "EUR"})
    with pytest.raises(durq.PayloadError):
        await ping.enqueue({"host": 5})


def _unreachable_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/no/such/dir/durq.sqlite3"
    if kind.startswith("postgres"):
        return "postgresql://postgres@127.0.0.1:1/test?schema=durq"
    return "redis://127.0.0.1:1/0"


async def test_E7_unreachable_broker_raises_promptly(broker_kind: str, tmp_path: Path) -> None:
    app = durq.App(_unreachable_url(broker_kind, tmp_path))
    started = time.monotonic()
    with pytest.raises(durq.BrokerUnavailableError):
        await app.enqueue("x:y", {"a": 1})
    assert time.monotonic() - started < 15
    await app.close()


async def test_E9_bulk_enqueue_reports_each_item(app: durq.App) -> None:
    await app.enqueue("x:y", {"n": 0}, task_id="taken")
    await app.enqueue("x:u", {"n": 1}, unique=3600)
    requests = [durq.EnqueueRequest("x:y", {"n": i}, task_id=f"bulk-{i}") for i in range(50)] + [
        durq.EnqueueRequest("x:y", {"n": 0}, task_id="taken"),
        durq.EnqueueRequest("x:u", {"n": 1}, unique=3600),
        durq.EnqueueRequest("x:y", {"n": 99}, process_in=3600, task_id="later"),
    ]
    outcomes = await app.enqueue_many(requests)
    assert len(outcomes) == len(requests)
    assert all(o.created for o in outcomes[:50])
    assert isinstance(outcomes[50].error, durq.TaskIDConflictError)
    assert isinstance(outcomes[51].error, durq.DuplicateTaskError)
    assert outcomes[52].created and outcomes[52].info is not None
    assert outcomes[52].info.state is TaskState.SCHEDULED
    stats = await app.inspector.queue_stats("default")
    assert stats.sizes[TaskState.PENDING] == 52 and stats.sizes[TaskState.SCHEDULED] == 1


async def test_E9_bulk_validates_everything_before_writing(app: durq.App) -> None:
    with pytest.raises(durq.PayloadError):
        await app.enqueue_many(
            [durq.EnqueueRequest("x:y", {"ok": 1}), durq.EnqueueRequest("x:y", [1])]
        )
    assert all(q.size == 0 for q in await app.inspector.list_queues())


def test_E10_sync_face_has_the_same_semantics(broker_url: str) -> None:
    app = durq.App(broker_url)
    migrator = open_broker(broker_url)
    asyncio.run(migrator.migrate())
    try:
        info = app.enqueue_sync("email:send", {"to": "a@b.c"}, task_id="sync-1")
        assert info.state is TaskState.PENDING
        with pytest.raises(durq.TaskIDConflictError):
            app.enqueue_sync("email:send", {"to": "a@b.c"}, task_id="sync-1")
        seen = app.run_sync(lambda: app.inspector.get_task_info("default", "sync-1"))
        assert seen.id == "sync-1"
    finally:
        app.close_sync()


async def test_S3_invalid_names_are_refused(app: durq.App) -> None:
    for queue in ("", "a b", "q;drop", "x" * 101, "{q}", "*"):
        with pytest.raises(durq.InvalidNameError):
            await app.enqueue("x:y", {}, queue=queue)
    with pytest.raises(durq.InvalidNameError):
        await app.enqueue("bad type", {})
    with pytest.raises(durq.InvalidNameError):
        await app.enqueue("x:y", {}, task_id="has space")


async def test_E2_non_finite_times_are_refused(app: durq.App) -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(durq.DurqError):
            await app.enqueue("x:y", {}, process_at=bad)
        with pytest.raises(durq.DurqError):
            await app.enqueue("x:y", {}, deadline=bad)


async def test_S3_reserved_types_are_refused_at_every_enqueue(app: durq.App) -> None:
    """``durq:`` types are durq's own: a caller cannot enqueue one (a forged ``durq:webhook``
    task would have its body signed), only durq's follow-ups create them."""
    forged = {"url": "https://partner.example/hook", "body": {"type": "task.completed"}}
    request = durq.EnqueueRequest("durq:webhook", forged, task_id="webhook:task.completed:x")
    attempts = [
        lambda: app.enqueue("durq:webhook", forged, task_id="webhook:task.completed:x"),
        lambda: app.enqueue("durq:anything", {}),
        lambda: app.enqueue_many([durq.EnqueueRequest("x:y", {}), request]),
        lambda: app.enqueue_group([durq.EnqueueRequest("x:y", {}), request]),
        lambda: app.enqueue("x:y", {}, then=durq.Then("durq:webhook", on_archived=True)),
        lambda: app.enqueue("x:y", {}, then="durq:webhook"),
        lambda: app.enqueue_group([durq.EnqueueRequest("x:y", {})], then="durq:webhook"),
    ]
    for attempt in attempts:
        with pytest.raises(durq.InvalidNameError, match="reserved"):
            await attempt()
    with pytest.raises(ConfigurationError, match="reserved"):
        app.add_periodic("@every 1h", "durq:webhook")
    assert all(q.size == 0 for q in await app.inspector.list_queues())
    # durq still creates its own: archiving a task that asked for a webhook makes a delivery.
    info = await app.enqueue(
        "x:y", {}, webhook="https://partner.example/hook", process_in=3600, max_retry=0
    )
    await app.inspector.archive_task(info.queue, info.id)
    delivery = await app.inspector.get_task_info(info.queue, f"webhook:archived:{info.id}")
    assert delivery.type == "durq:webhook"


async def test_S3_dot_task_ids_are_refused(app: durq.App) -> None:
    """``.`` and ``..`` would be read as path segments by the dashboard's links."""
    for task_id in (".", ".."):
        with pytest.raises(durq.InvalidNameError, match="path segment"):
            await app.enqueue("x:y", {}, task_id=task_id)
        with pytest.raises(durq.InvalidNameError):
            await app.enqueue_many([durq.EnqueueRequest("x:y", {}, task_id=task_id)])
    # Dots inside an id, or a dot segment inside an id with "/" (quoted whole in a link), stay
    # valid.
    for task_id in ("...", ".a", "a.", "a/..", "../a"):
        assert (await app.enqueue("x:y", {}, task_id=task_id)).id == task_id
