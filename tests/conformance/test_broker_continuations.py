"""Continuations at the broker seam: a follow-up rides on complete/archive and is written in the
same atomic step, or not at all when the lease is lost; tasks archived by the rescuer or the
inspector create the follow-up their ``durq-then`` header asks for."""

from __future__ import annotations

import json

from brokerkit import LEASE, A, X, claim, params, picture, put, snapshot

from conformance.conftest import requires
from durq import continuations, lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import (
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    ArchiveParams,
    CompleteParams,
    LeaseRef,
)
from durq.clock import FakeClock

NEXT = "test:next"


def follow(parent: str, queue: str = "default", **payload: object) -> tuple:  # type: ignore[type-arg]
    return (params(f"then:{parent}", queue, type=NEXT, payload={"of": parent, **payload}),)


def then_header(queue: str = "default", *, on_archived: bool = True) -> dict[str, str]:
    spec = {
        "type": NEXT,
        "queue": queue,
        "on_archived": on_archived,
        "max_retry": 3,
        "timeout": None,
        "retention": 0.0,
    }
    return {continuations.HEADER: json.dumps(spec)}


async def test_complete_creates_the_follow_up_with_it(broker: FullBroker, clock: FakeClock) -> None:
    leases = await put(broker, clock, {"a": A})
    done = await broker.complete(CompleteParams(leases["a"].ref, b'{"n":1}', 60, follow("a")))
    assert done
    assert await snapshot(broker) == picture(completed="a", pending="then:a")
    info = await broker.admin.get_task("default", "then:a")
    assert info.type == NEXT and info.payload == {"of": "a"}
    # The follow-up is claimable like any task (and woke nobody in the wrong way).
    (lease,) = await claim(broker)
    assert lease.task.id == "then:a"


async def test_complete_deleting_the_task_still_creates_the_follow_up(
    broker: FullBroker, clock: FakeClock
) -> None:
    leases = await put(broker, clock, {"a": A})
    assert await broker.complete(CompleteParams(leases["a"].ref, None, 0, follow("a")))
    assert await snapshot(broker) == picture(pending="then:a")


async def test_follow_up_in_another_queue(broker: FullBroker, clock: FakeClock) -> None:
    requires(broker, CAP_CROSS_QUEUE_FOLLOW_UPS)
    leases = await put(broker, clock, {"a": A})
    assert await broker.complete(CompleteParams(leases["a"].ref, None, 60, follow("a", "mail")))
    assert await snapshot(broker) == picture(completed="a")
    assert await snapshot(broker, "mail") == picture(pending="then:a")
    assert "mail" in {q.name for q in await broker.admin.list_queues()}
    (lease,) = await claim(broker, "mail")
    assert lease.task.id == "then:a"


async def test_stale_token_creates_neither(broker: FullBroker, clock: FakeClock) -> None:
    leases = await put(broker, clock, {"a": A, "b": A})
    stale = LeaseRef("default", "a", "not-the-token")
    assert not await broker.complete(CompleteParams(stale, None, 60, follow("a")))
    stale_b = LeaseRef("default", "b", "not-the-token")
    assert not await broker.archive(ArchiveParams(stale_b, "boom", follow_ups=follow("b")))
    assert await snapshot(broker) == picture(active="a b")
    # A lease that expired and was rescued is no longer held either.
    clock.advance(LEASE + 1)
    await lifecycle.rescue_expired(broker, 5)
    assert not await broker.complete(CompleteParams(leases["a"].ref, None, 60, follow("a")))
    assert await snapshot(broker) == picture(retry="a b")


async def test_follow_up_id_conflict_does_not_fail_the_completion(
    broker: FullBroker, clock: FakeClock
) -> None:
    leases = await put(broker, clock, {"a": A})
    await broker.enqueue(params("then:a", type=NEXT, payload={"first": True}))
    done = await broker.complete(CompleteParams(leases["a"].ref, None, 60, follow("a")))
    assert done
    assert await snapshot(broker) == picture(completed="a", pending="then:a")
    assert (await broker.admin.get_task("default", "then:a")).payload == {"first": True}


async def test_archive_creates_the_follow_up(broker: FullBroker, clock: FakeClock) -> None:
    leases = await put(broker, clock, {"a": A, "b": A})
    assert await broker.archive(ArchiveParams(leases["a"].ref, "boom", follow_ups=follow("a")))
    cancelled = ArchiveParams(leases["b"].ref, "cancelled", count_attempt=False)
    assert await broker.archive(cancelled)  # no follow-ups: nothing else
    assert await snapshot(broker) == picture(archived="a b", pending="then:a")


async def test_complete_many_carries_each_items_follow_ups(
    broker: FullBroker, clock: FakeClock
) -> None:
    leases = await put(broker, clock, {"a": A, "b": A, "c": A})
    items = [
        CompleteParams(leases["a"].ref, None, 60, follow("a")),
        CompleteParams(LeaseRef("default", "b", "stale"), None, 60, follow("b")),
        CompleteParams(leases["c"].ref, None, 60),
    ]
    assert await broker.complete_many(items) == [True, False, True]
    assert await snapshot(broker) == picture(completed="a c", active="b", pending="then:a")


async def test_rescuer_archive_creates_the_follow_up_of_the_header(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("pill", headers=then_header("after")))
    await broker.enqueue(params("plain"))
    await claim(broker)
    clock.advance(LEASE + 1)
    rescued = await lifecycle.rescue_expired(broker, 1)
    assert {t.id: t.state for t in rescued} == {"pill": X, "plain": X}
    assert await snapshot(broker, "after") == picture(pending="then:pill")
    info = await broker.admin.get_task("after", "then:pill")
    assert info.type == NEXT and info.max_retry == 3
    assert info.payload == {
        "task": {"id": "pill", "queue": "default", "type": "test:task", "state": "archived"},
        "payload": {"id": "pill"},
        "error": "worker lost",
    }
    assert info.headers[continuations.PARENT_HEADER] == "pill"


async def test_rescue_to_retry_creates_nothing(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", headers=then_header(), max_retry=5))
    await claim(broker)
    clock.advance(LEASE + 1)
    await lifecycle.rescue_expired(broker, 3)
    assert await snapshot(broker) == picture(retry="t")


async def test_inspector_archive_and_cancel_create_the_follow_up(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("x", headers=then_header()))
    await broker.enqueue(params("y", headers=then_header()))
    await broker.enqueue(params("z", headers=then_header(on_archived=False)))
    await lifecycle.archive_task(broker.admin, "default", "x")
    await lifecycle.cancel_task(broker.admin, "default", "y")
    await lifecycle.archive_task(broker.admin, "default", "z")
    assert await snapshot(broker) == picture(archived="x y z", pending="then:x then:y")
    assert (await broker.admin.get_task("default", "then:y")).payload["error"] == "cancelled"
    # Archiving again after a rerun finds the follow-up there: skipped, no error.
    await lifecycle.run_task(broker.admin, "default", "x")
    await lifecycle.archive_task(broker.admin, "default", "x")
    assert await snapshot(broker) == picture(archived="x y z", pending="then:x then:y")


async def test_cancel_of_an_active_task_waits_for_its_worker(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("a", headers=then_header()))
    (lease,) = await claim(broker)
    await lifecycle.cancel_task(broker.admin, "default", "a")
    assert await snapshot(broker) == picture(active="a")  # the worker archives it
    follow_ups = continuations.build(lease.task, continuations.ARCHIVED, error="cancelled")
    assert await broker.archive(
        ArchiveParams(lease.ref, "cancelled", count_attempt=False, follow_ups=follow_ups)
    )
    assert await snapshot(broker) == picture(archived="a", pending="then:a")


def test_follow_up_ids_stay_within_the_limit() -> None:
    assert continuations.follow_up_id("abc") == "then:abc"
    long_id = "x" * 200
    assert len(continuations.follow_up_id(long_id)) <= 200
    assert continuations.follow_up_id(long_id) != continuations.follow_up_id("y" * 200)


def test_on_completed_false_is_a_failure_handler() -> None:
    from durq.task import TaskInfo

    header = then_header(on_archived=True)
    spec = json.loads(header[continuations.HEADER])
    spec["on_completed"] = False
    task = TaskInfo(
        id="t",
        queue="default",
        type="test:task",
        raw_payload=b"{}",
        state=A,
        max_retry=0,
        headers={continuations.HEADER: json.dumps(spec)},
    )
    assert continuations.build(task, continuations.COMPLETED, result=b"1") == ()
    (follow_up,) = continuations.build(task, continuations.ARCHIVED, error="boom")
    assert follow_up.id == "then:t"
