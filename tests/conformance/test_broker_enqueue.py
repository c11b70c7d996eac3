"""Enqueue (E1-E4): fields, scheduling, task-id conflicts and uniqueness, on every broker."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from brokerkit import LATER, A, C, P, R, S, X, claim, claim_ids, params, picture, put, snapshot

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import ArchiveParams, CompleteParams
from durq.clock import FakeClock
from durq.errors import DuplicateTaskError, TaskIDConflictError
from durq.states import TaskState


def at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


async def test_E1_enqueue_returns_task_info(broker: FullBroker, clock: FakeClock) -> None:
    p = params(
        "t1",
        payload={"to": "a@b.c", "n": [1, 2]},
        max_retry=5,
        timeout=30.0,
        deadline=clock.now() + 600,
        headers={"traceparent": "00-abc-def-01"},
    )
    info = await broker.enqueue(p)
    assert (info.id, info.queue, info.type, info.state) == ("t1", "default", "test:task", P)
    assert info.payload == {"to": "a@b.c", "n": [1, 2]}
    assert (info.max_retry, info.retried, info.last_error) == (5, 0, None)
    assert info.timeout == 30.0
    assert info.deadline == at(clock.now() + 600)
    assert info.enqueued_at == at(clock.now())
    assert info.next_process_at == at(clock.now())
    assert info.completed_at is None and info.raw_result is None
    assert info.headers == {"traceparent": "00-abc-def-01"}
    stored = await broker.admin.get_task("default", "t1")
    assert stored.payload == info.payload
    assert stored.headers == info.headers
    assert (stored.max_retry, stored.timeout, stored.deadline) == (5, 30.0, info.deadline)


async def test_E2_scheduled_not_claimable_before_its_time(
    broker: FullBroker, clock: FakeClock
) -> None:
    info = await broker.enqueue(params("later", process_at=clock.now() + 60))
    assert info.state is S
    assert info.next_process_at == at(clock.now() + 60)
    assert await claim_ids(broker) == []
    clock.advance(59.9)
    assert await claim_ids(broker) == []
    clock.advance(0.1)
    assert await claim_ids(broker) == ["later"]


async def test_E2_promote_due_moves_only_due_tasks(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("soon", process_at=clock.now() + 10))
    await broker.enqueue(params("late", process_at=clock.now() + 100))
    clock.advance(10)
    assert await broker.promote_due() == 1
    assert await snapshot(broker) == picture(pending="soon", scheduled="late")
    assert await broker.promote_due() == 0


async def test_E2_process_at_in_the_past_is_pending(broker: FullBroker, clock: FakeClock) -> None:
    info = await broker.enqueue(params("past", process_at=clock.now() - 5))
    assert info.state is P
    assert await claim_ids(broker) == ["past"]


async def test_E2_schedule_survives_a_new_broker(make_broker, clock: FakeClock) -> None:
    first = await make_broker()
    await first.enqueue(params("kept", process_at=clock.now() + 30))
    await first.close()
    second = await make_broker()
    assert await claim_ids(second) == []
    clock.advance(30)
    assert await claim_ids(second) == ["kept"]


@pytest.mark.parametrize("state", [P, S, A, R, X, C])
async def test_E3_task_id_conflict_in_every_state(
    broker: FullBroker, clock: FakeClock, state: TaskState
) -> None:
    await put(broker, clock, {"order-1": state})
    before = await snapshot(broker)
    original = await broker.admin.get_task("default", "order-1")
    with pytest.raises(TaskIDConflictError) as caught:
        await broker.enqueue(params("order-1", payload={"other": True}))
    existing = caught.value.existing
    assert existing is not None
    assert (existing.id, existing.queue, existing.state) == ("order-1", "default", state)
    assert await snapshot(broker) == before
    assert (await broker.admin.get_task("default", "order-1")).raw_payload == original.raw_payload


async def test_E3_same_id_in_another_queue_is_not_a_conflict(broker: FullBroker) -> None:
    await broker.enqueue(params("same", "q1"))
    await broker.enqueue(params("same", "q2"))
    assert (await broker.admin.get_task("q1", "same")).queue == "q1"
    assert (await broker.admin.get_task("q2", "same")).queue == "q2"


async def test_E3_completed_within_retention_conflicts_after_retention_not(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"done": C}, retention=100)
    clock.advance(99)
    with pytest.raises(TaskIDConflictError) as caught:
        await broker.enqueue(params("done"))
    assert caught.value.existing is not None
    assert caught.value.existing.state is C
    clock.advance(1)  # retention passed; the janitor has not run
    info = await broker.enqueue(params("done"))
    assert info.state is P
    assert await snapshot(broker) == picture(pending="done")


async def test_E3_deleted_on_completion_frees_the_id(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"gone": C}, retention=0)
    assert await snapshot(broker) == {}
    assert (await broker.enqueue(params("gone"))).state is P


async def test_E4_duplicate_refused_within_ttl(broker: FullBroker, clock: FakeClock) -> None:
    first = await broker.enqueue(params("u1", payload={"a": 1}, unique_key="k1", unique_ttl=60))
    with pytest.raises(DuplicateTaskError) as caught:
        await broker.enqueue(params("u2", payload={"a": 1}, unique_key="k1", unique_ttl=60))
    assert caught.value.existing_id == first.id
    assert await snapshot(broker) == picture(pending="u1")
    clock.advance(60)
    await broker.enqueue(params("u3", payload={"a": 1}, unique_key="k1", unique_ttl=60))
    assert await snapshot(broker) == picture(pending="u1 u3")


async def test_E4_other_keys_are_independent(broker: FullBroker) -> None:
    await broker.enqueue(params("a", unique_key="k1", unique_ttl=60))
    await broker.enqueue(params("b", unique_key="k2", unique_ttl=60))
    await broker.enqueue(params("c"))
    assert await snapshot(broker) == picture(pending="a b c")


async def test_E4_freed_when_first_task_completes(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("u1", unique_key="k", unique_ttl=3600))
    (lease,) = await claim(broker)
    with pytest.raises(DuplicateTaskError):
        await broker.enqueue(params("u2", unique_key="k", unique_ttl=3600))
    assert await broker.complete(CompleteParams(lease.ref, None, retention=600))
    info = await broker.enqueue(params("u2", unique_key="k", unique_ttl=3600))
    assert info.state is P


async def test_E4_freed_when_first_task_is_archived(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("u1", unique_key="k", unique_ttl=3600))
    (lease,) = await claim(broker)
    assert await broker.archive(ArchiveParams(lease.ref, "gave up"))
    assert (await broker.enqueue(params("u2", unique_key="k", unique_ttl=3600))).state is P


async def test_E4_freed_when_inspector_archives(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("u1", unique_key="k", unique_ttl=3600))
    await lifecycle.archive_task(broker.admin, "default", "u1")
    assert (await broker.enqueue(params("u2", unique_key="k", unique_ttl=3600))).state is P


async def test_E4_holds_while_scheduled_or_retrying(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(
        params("u1", unique_key="k", unique_ttl=LATER * 2, process_at=clock.now() + 60)
    )
    with pytest.raises(DuplicateTaskError):
        await broker.enqueue(params("u2", unique_key="k", unique_ttl=LATER * 2))


async def test_E3_checked_before_E4(broker: FullBroker) -> None:
    await broker.enqueue(params("same", unique_key="k", unique_ttl=60))
    with pytest.raises(TaskIDConflictError):
        await broker.enqueue(params("same", unique_key="k", unique_ttl=60))


async def test_S3_names_with_separators_round_trip(broker: FullBroker, clock: FakeClock) -> None:
    queue, task_type, task_id = "critical:eu-west.1", "insurance:check-coverage.v2", "order-1.a:b"
    info = await broker.enqueue(params(task_id, queue, type=task_type))
    assert (info.id, info.queue, info.type) == (task_id, queue, task_type)
    got = await broker.admin.get_task(queue, task_id)
    assert (got.id, got.queue, got.type) == (task_id, queue, task_type)
    assert queue in {q.name for q in await broker.admin.list_queues()}
    (lease,) = await claim(broker, queue)
    assert (lease.task.id, lease.task.type) == (task_id, task_type)
    assert await broker.complete(CompleteParams(lease.ref, b"1", retention=60))
    assert (await broker.admin.get_task(queue, task_id)).state is C


async def test_I1_queue_known_after_enqueue(broker: FullBroker) -> None:
    assert "fresh" not in {q.name for q in await broker.admin.list_queues()}
    await broker.enqueue(params("x", "fresh"))
    stats = await broker.admin.queue_stats("fresh")
    assert stats.sizes[P] == 1 and not stats.paused


async def test_E1_payload_bytes_stored_verbatim(broker: FullBroker) -> None:
    raw = '{"name":"Zoë","emoji":"✓","nested":{"b":[1,2.5,null,true]}}'.encode()
    p = params("raw")
    p = type(p)(**{**{f: getattr(p, f) for f in p.__dataclass_fields__}, "payload": raw})
    await broker.enqueue(p)
    assert (await broker.admin.get_task("default", "raw")).raw_payload == raw
    (lease,) = await claim(broker)
    assert lease.task.raw_payload == raw
