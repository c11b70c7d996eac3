"""W25: a strict sequence per key. Tasks of a sequence's key run one at a time, and a task
keeps the key from its first start until it finishes: a retry, a snooze or wait, a hand-back
or a rescued lease leaves the slot counted and the task is let in again before the others;
completing, archiving, cancelling or deleting it (one task or a whole state) frees the key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from brokerkit import P, Q, R, W, claim, claim_ids, params, snapshot
from test_broker_limits import limits_of
from test_broker_wakeup import BOUND, woken_by

import durq
from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import Claimed, CompleteParams, Lease, RetryParams
from durq.clock import FakeClock
from durq.errors import ValidationError
from durq.task import LimitSpec, limits_from_json, limits_to_json

SEQ = LimitSpec("acct:1", concurrency=1, sequence=True)


async def enqueue(
    broker: FullBroker, clock: FakeClock, task_id: str, *limits: LimitSpec, max_retry: int = 5
) -> None:
    await broker.enqueue(params(task_id, limits=limits or (SEQ,), max_retry=max_retry))
    clock.advance(0.001)  # a strict enqueue order on every broker


async def fail(broker: FullBroker, clock: FakeClock, lease: Lease, delay: float = 10.0) -> None:
    """The worker's decision on a failed attempt (it keeps the key while retries are left)."""
    move = lifecycle.failed(lease, "boom", now=clock.now(), delay=lambda: delay)
    if isinstance(move, RetryParams):
        assert move.keep is lifecycle.keeps_key(lease.task)
        assert await broker.retry(move)
    else:
        assert await broker.archive(move)


async def one(broker: FullBroker) -> Lease:
    (lease,) = await claim(broker, limit=10)
    return lease


async def test_W25_a_failed_task_keeps_its_key_until_its_retry_completes(
    broker: FullBroker, clock: FakeClock
) -> None:
    for task_id in ("t0", "t1", "t2"):
        await enqueue(broker, clock, task_id)
    t0 = await one(broker)
    assert t0.task.id == "t0"
    await fail(broker, clock, t0)
    # Nothing runs, yet the key is taken: the next task waits for t0's retry.
    assert await claim_ids(broker) == []
    assert await snapshot(broker) == {P: ["t1", "t2"], R: ["t0"]}
    assert await limits_of(broker) == {"acct:1": (1, 2)}
    clock.advance(11)
    again = await one(broker)
    assert again.task.id == "t0" and again.task.retried == 1
    assert await limits_of(broker) == {"acct:1": (1, 2)}  # not counted twice
    assert await broker.complete(CompleteParams(again.ref, limited=True))
    t1 = await one(broker)
    assert t1.task.id == "t1"
    assert await broker.complete(CompleteParams(t1.ref, limited=True))
    assert await claim_ids(broker) == ["t2"]
    assert await limits_of(broker) == {"acct:1": (1, 0)}


async def test_W25_a_rescued_lease_keeps_the_key(broker: FullBroker, clock: FakeClock) -> None:
    await enqueue(broker, clock, "t0")
    await enqueue(broker, clock, "t1")
    t0 = await one(broker)
    clock.advance(60)  # its worker died: the lease ran out
    rescued = await lifecycle.rescue_expired(broker, max_lost=3)
    assert [(t.id, t.state) for t in rescued] == [("t0", R)]
    assert await limits_of(broker) == {"acct:1": (1, 1)}
    again = await one(broker)  # due at once, and before t1
    assert (again.task.id, again.task.lost) == ("t0", 1)
    assert await claim_ids(broker) == []
    assert t0.token != again.token


async def test_W25_a_hand_back_and_a_wait_keep_the_key(
    broker: FullBroker, clock: FakeClock
) -> None:
    await enqueue(broker, clock, "t0")
    await enqueue(broker, clock, "t1")
    t0 = await one(broker)
    assert await broker.requeue(lifecycle.handed_back(t0), keep=lifecycle.keeps_key(t0.task))
    t0 = await one(broker)
    assert t0.task.id == "t0"
    assert await broker.retry(lifecycle.slept(t0, 30.0, awaits="go"))  # ctx.wait_for
    assert await snapshot(broker) == {P: ["t1"], W: ["t0"]}
    assert await claim_ids(broker) == []
    clock.advance(31)
    t0 = await one(broker)
    assert t0.task.id == "t0"
    assert await limits_of(broker) == {"acct:1": (1, 1)}


async def test_W25_other_limits_are_given_back_while_the_sequence_is_kept(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A task with a sequence and a shared bulkhead: its retry gives the bulkhead's slot to
    another key's task at once, and keeps its own sequence."""
    pool = LimitSpec("pool", concurrency=1)
    other = LimitSpec("acct:2", concurrency=1, sequence=True)
    await enqueue(broker, clock, "a0", SEQ, pool)
    await enqueue(broker, clock, "b0", other, pool)
    await enqueue(broker, clock, "a1", SEQ, pool)
    a0 = await one(broker)
    assert a0.task.id == "a0"
    await fail(broker, clock, a0)
    b0 = await one(broker)
    assert b0.task.id == "b0"
    assert await limits_of(broker) == {"acct:1": (1, 1), "pool": (1, 0), "acct:2": (1, 0)}


async def _complete(broker: FullBroker, clock: FakeClock, lease: Lease) -> None:
    clock.advance(11)
    again = await one(broker)
    assert await broker.complete(CompleteParams(again.ref, limited=True))


async def _out_of_retries(broker: FullBroker, clock: FakeClock, lease: Lease) -> None:
    clock.advance(11)
    await fail(broker, clock, await one(broker))  # its last retry fails: archived


async def _archive(broker: FullBroker, clock: FakeClock, lease: Lease) -> None:
    await lifecycle.archive_task(broker.admin, Q, "t0")


async def _cancel(broker: FullBroker, clock: FakeClock, lease: Lease) -> None:
    await lifecycle.cancel_task(broker.admin, Q, "t0")


async def _delete(broker: FullBroker, clock: FakeClock, lease: Lease) -> None:
    await lifecycle.delete_task(broker.admin, Q, "t0")


async def _delete_all(broker: FullBroker, clock: FakeClock, lease: Lease) -> None:
    assert await lifecycle.delete_all(broker.admin, Q, R) == 1


async def _run_then_archive(broker: FullBroker, clock: FakeClock, lease: Lease) -> None:
    # Run now keeps the key (pending, it starts before the others); archived, it frees it.
    await lifecycle.run_task(broker.admin, Q, "t0")
    await lifecycle.archive_task(broker.admin, Q, "t0")


_Free = Callable[[FullBroker, FakeClock, Lease], Awaitable[None]]
FREES: dict[str, _Free] = {
    "completed": _complete,
    "out of retries": _out_of_retries,
    "archived": _archive,
    "cancelled": _cancel,
    "deleted": _delete,
    "deleted in bulk": _delete_all,
    "run, then archived": _run_then_archive,
}


@pytest.mark.parametrize("end", list(FREES))
async def test_W25_the_key_is_free_once_the_task_finishes_or_leaves(
    broker: FullBroker, clock: FakeClock, end: str
) -> None:
    await enqueue(broker, clock, "t0", max_retry=1)
    await enqueue(broker, clock, "t1")
    t0 = await one(broker)
    await fail(broker, clock, t0)  # waits for its retry, holding the key
    assert await claim_ids(broker) == []
    await FREES[end](broker, clock, t0)
    assert await claim_ids(broker) == ["t1"]
    assert await limits_of(broker) == {"acct:1": (1, 0)}


async def test_W25_the_inspector_freeing_a_kept_key_wakes_the_workers(
    make_broker, clock: FakeClock
) -> None:
    """A task waits on the key its failed predecessor keeps; archiving that one wakes the
    queue's idle workers (no other event would: nothing runs)."""
    admin = await make_broker()
    await enqueue(admin, clock, "t0")
    await enqueue(admin, clock, "t1")
    await fail(admin, clock, await one(admin), delay=3600)
    assert await claim_ids(admin) == []
    waiter = await make_broker()
    woken, took = await woken_by(waiter, [Q], lambda: lifecycle.archive_task(admin.admin, Q, "t0"))
    assert woken and took < BOUND
    assert await claim_ids(waiter) == ["t1"]


async def test_W25_a_rate_with_a_sequence_takes_a_token_per_attempt(
    broker: FullBroker, clock: FakeClock
) -> None:
    """2 per 10 s beside the sequence: the kept task's retries take tokens (the slot is not
    counted again), and once they are spent it waits for the next token, held on the rate's
    key; the next task of the sequence waits for it."""
    rate = LimitSpec("acct-api:1", rate=2, per=10.0)
    await enqueue(broker, clock, "t0", SEQ, rate)
    await enqueue(broker, clock, "t1", SEQ, rate)
    await fail(broker, clock, await one(broker), delay=0)
    again = await one(broker)
    assert again.task.id == "t0"
    await fail(broker, clock, again, delay=0)
    got = await claim(broker, limit=10)
    assert got == []
    if isinstance(got, Claimed):
        assert got.wake_at is not None and got.wake_at <= clock.now() + 5.0 + 1e-6
    clock.advance(5.1)
    again = await one(broker)
    assert again.task.id == "t0"
    assert await broker.complete(CompleteParams(again.ref, limited=True))
    assert await claim_ids(broker) == []  # the slot is free, the bucket is not
    clock.advance(5.1)
    assert await claim_ids(broker) == ["t1"]


async def test_W25_priority_and_due_time_order_the_waiting_tasks(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A task of higher priority enqueued later goes before the other waiting ones, never
    before the task that keeps the key; a task delayed into the future waits for its time."""
    await enqueue(broker, clock, "t0")
    t0 = await one(broker)
    await broker.enqueue(params("later", limits=(SEQ,), process_in=100.0))
    await enqueue(broker, clock, "t1")
    await broker.enqueue(params("urgent", limits=(SEQ,), priority=5))
    await fail(broker, clock, t0, delay=1)
    clock.advance(2)
    order = []
    for _ in range(3):
        lease = await one(broker)
        order.append(lease.task.id)
        assert await broker.complete(CompleteParams(lease.ref, limited=True))
    assert order == ["t0", "urgent", "t1"]
    assert await snapshot(broker) == {durq.TaskState.SCHEDULED: ["later"]}


def test_W25_stored_limits_round_trip_and_old_rows_have_no_sequence() -> None:
    text = limits_to_json((SEQ, LimitSpec("k", 3)))
    assert text == '[["acct:1",1,null,null,null,1,1],["k",3,null,null]]'
    assert limits_from_json(text) == (SEQ, LimitSpec("k", 3))
    assert limits_from_json('[["k",1,null,null,null,2]]')[0].sequence is False


def test_W25_a_sequence_runs_one_at_a_time() -> None:
    assert durq.Limit("acct:{account}", sequence=True).concurrency == 1
    with pytest.raises(ValidationError, match="a sequence takes no rate of its own"):
        durq.Limit("a", sequence=True, rate="5/s")
    with pytest.raises(ValidationError, match="one task at a time"):
        durq.Limit("acct:{account}", concurrency=2, sequence=True)
    with pytest.raises(ValidationError, match="exceeds its concurrency 1"):
        durq.Limit("a", sequence=True, cost=2)
    spec = durq.Limit("acct:{account}", sequence=True).resolve({"account": 7})
    assert spec == LimitSpec("acct:7", concurrency=1, sequence=True)
    assert spec.describe() == "1 at once, in sequence"
