"""Rescue of expired leases (W1): retry "lease expired", or archived when lost too often or
out of retries; leases that still hold are never touched."""

from __future__ import annotations

from brokerkit import LEASE, A, P, R, X, claim, claim_ids, params, picture, put, snapshot

from durq import lifecycle
from durq.brokers import FullBroker
from durq.clock import FakeClock


async def test_W1_expired_lease_becomes_retry_due_now(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=5))
    await claim(broker, lease=LEASE)
    clock.advance(LEASE + 0.5)
    (task,) = await lifecycle.rescue_expired(broker, 3)
    assert (task.id, task.queue, task.state) == ("t", "default", R)
    assert (task.retried, task.lost, task.last_error) == (1, 1, "lease expired")
    assert await snapshot(broker) == picture(retry="t")
    (again,) = await claim(broker)  # due now: no waiting for a backoff
    assert again.task.retried == 1 and again.task.lost == 1


async def test_W1_lease_still_held_is_not_rescued(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("short"))
    await claim(broker, lease=10)
    await broker.enqueue(params("long"))
    await claim(broker, lease=60)
    clock.advance(30)
    rescued = await lifecycle.rescue_expired(broker, 3)
    assert [t.id for t in rescued] == ["short"]
    assert await snapshot(broker) == picture(retry="short", active="long")
    assert await lifecycle.rescue_expired(broker, 3) == []


async def test_W1_poison_pill_archived_after_max_lost(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("pill", max_retry=25))
    for round_ in (1, 2):
        await claim(broker)
        clock.advance(LEASE + 1)
        (task,) = await lifecycle.rescue_expired(broker, 3)
        assert (task.state, task.lost, task.retried) == (R, round_, round_)
    await claim(broker)
    clock.advance(LEASE + 1)
    (task,) = await lifecycle.rescue_expired(broker, 3)
    assert (task.state, task.lost, task.retried) == (X, 3, 3)
    assert task.last_error == "worker lost"
    assert await claim_ids(broker) == []
    assert await snapshot(broker) == picture(archived="pill")


async def test_W1_max_lost_is_the_callers(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=25))
    await claim(broker)
    clock.advance(LEASE + 1)
    (task,) = await lifecycle.rescue_expired(broker, 1)
    assert task.state is X and task.last_error == "worker lost"


async def test_W1_rescue_archives_when_retries_are_used_up(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t", max_retry=0))
    await claim(broker)
    clock.advance(LEASE + 1)
    (task,) = await lifecycle.rescue_expired(broker, 10)
    assert task.state is X and task.retried == 1
    assert await snapshot(broker) == picture(archived="t")


async def test_W1_rescue_state_table(broker: FullBroker, clock: FakeClock) -> None:
    leases = await put(broker, clock, {"a1": A, "a2": A, "r": R, "x": X, "p": P}, max_retry=5)
    clock.advance(LEASE - 5)
    await broker.extend_leases([leases["a2"].ref], LEASE)
    clock.advance(10)
    rescued = await lifecycle.rescue_expired(broker, 3)
    assert [t.id for t in rescued] == ["a1"]
    assert await snapshot(broker) == picture(retry="a1 r", active="a2", archived="x", pending="p")


async def test_W1_rescue_counts_processed_and_failed(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t"))
    await claim(broker)
    clock.advance(LEASE + 1)
    await lifecycle.rescue_expired(broker, 3)
    stats = await broker.admin.queue_stats("default")
    assert (stats.processed_today, stats.failed_today) == (1, 1)


async def test_W1_running_a_worker_lost_task_gives_it_max_lost_chances_again(
    broker: FullBroker, clock: FakeClock
) -> None:
    # The inspector's run (one task or all) starts the poison-pill count afresh on every
    # backend: otherwise one more lost lease would archive the task again at once.
    for task_id in ("one", "all"):
        await broker.enqueue(params(task_id, max_retry=25))
        await claim(broker)
        clock.advance(LEASE + 1)
        (task,) = await lifecycle.rescue_expired(broker, 1)
        assert (task.state, task.lost) == (X, 1)
    assert (await lifecycle.run_task(broker.admin, "default", "one")).lost == 0
    assert await lifecycle.run_all(broker.admin, "default", X) == 1
    assert (await broker.admin.get_task("default", "all")).lost == 0
    await claim(broker, limit=2)
    clock.advance(LEASE + 1)
    rescued = await lifecycle.rescue_expired(broker, 2)
    assert sorted((t.id, t.state, t.lost) for t in rescued) == [("all", R, 1), ("one", R, 1)]
