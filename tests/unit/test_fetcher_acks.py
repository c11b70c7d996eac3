"""A busy worker's acks ride in its next claim (one round trip instead of two) where the
broker declares it can carry them, else go ahead of the claim as ``complete_many``; either
way it never holds more unacknowledged leases than slots: the re-run bound of
docs/guarantees.md."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import durq
from apptools import AppFactory
from durq.brokers.base import (
    CAP_COMPLETE_AND_CLAIM,
    CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
    CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS,
    ClaimParams,
    CompleteParams,
    EnqueueParams,
    Lease,
    LeaseRef,
    MemberOutcome,
)
from durq.worker.fetcher import complete_then_claim, rides_in_claim
from fetchkit import (
    CountingBroker,
    assert_acks_hand_a_limited_slot_on,
    enqueue_counted,
    fetcher_on,
    run_fetcher,
)


@pytest.mark.parametrize("url", ["sqlite", "memory://fetcher-acks"])
async def test_acks_ride_in_the_next_claim_within_the_slots(url: str, tmp_path: Path) -> None:
    if url == "sqlite":
        url = f"sqlite:///{tmp_path / 'durq.sqlite3'}"
    app = durq.App(url)
    ran, finished = await enqueue_counted(app, 40)
    broker = CountingBroker(app.new_broker())
    executor = await run_fetcher(app, broker, finished, poll_interval=0.05)
    for _ in range(5):  # the last acks go out on their own once the fetcher idles
        await asyncio.sleep(0.01)
    assert sorted(ran) == list(range(40))
    assert broker.most_unacked <= 4
    assert broker.unacked == 0
    # 40 tasks in batches of 4: the acks of one batch travel with the claim of the next,
    # or just ahead of it where the broker cannot carry them (memory://, no round trip).
    carried = "complete_and_claim" if CAP_COMPLETE_AND_CLAIM in broker.capabilities else "claim"
    assert broker.calls.count(carried) >= 9, broker.calls
    trips_per_claim = 1 if carried == "complete_and_claim" else 2
    assert len(broker.calls) <= 14 * trips_per_claim, broker.calls
    await executor.close()
    await broker.close()
    await app.close()


PLAIN = CompleteParams(LeaseRef("a", "t1", "tok"))
FOLLOWS = CompleteParams(
    LeaseRef("a", "t2", "tok"),
    follow_ups=(EnqueueParams(id="n", queue="a", type="t", payload=b""),),
)
GROUPED = CompleteParams(
    LeaseRef("a", "t3", "tok"), group=MemberOutcome("g", "a", "completed", b"{}")
)
OTHER_QUEUE = CompleteParams(LeaseRef("b", "t4", "tok"))
ALL = frozenset(
    {CAP_COMPLETE_AND_CLAIM, CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS, CAP_COMPLETE_AND_CLAIM_ANY_QUEUE}
)


@pytest.mark.parametrize(
    ("capabilities", "items", "limit", "rides"),
    [
        (ALL, [PLAIN, FOLLOWS, GROUPED, OTHER_QUEUE], 1, True),
        (ALL, [], 1, False),  # nothing to carry: a claim alone
        (ALL, [PLAIN], 0, False),  # no slot to claim: the completions alone
        (frozenset(), [PLAIN], 1, False),  # memory://
        ({CAP_COMPLETE_AND_CLAIM}, [PLAIN], 1, True),
        ({CAP_COMPLETE_AND_CLAIM}, [PLAIN, FOLLOWS], 1, False),
        ({CAP_COMPLETE_AND_CLAIM}, [GROUPED], 1, False),
        ({CAP_COMPLETE_AND_CLAIM}, [OTHER_QUEUE], 1, False),
        (ALL - {CAP_COMPLETE_AND_CLAIM_ANY_QUEUE}, [FOLLOWS, GROUPED], 1, True),  # a cluster
        (ALL - {CAP_COMPLETE_AND_CLAIM_ANY_QUEUE}, [PLAIN, OTHER_QUEUE], 1, False),
        (ALL - {CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS}, [PLAIN, OTHER_QUEUE], 1, True),  # postgres
        (ALL - {CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS}, [GROUPED], 1, False),
        (ALL - {CAP_COMPLETE_AND_CLAIM}, [PLAIN], 1, False),
    ],
)
def test_which_completions_ride_in_a_claim(
    capabilities: frozenset[str], items: list[CompleteParams], limit: int, rides: bool
) -> None:
    claim = ClaimParams(["a", "b"], limit, "w", 30)
    assert rides_in_claim(frozenset(capabilities), items, claim) is rides


async def test_acks_sent_alone_are_answered_before_the_claim_that_fails() -> None:
    """Stored acks are not failed (and sent again by their attempts) when the claim after
    them fails."""
    app = durq.App("memory://fetcher-acks-claim-fails")
    await app.enqueue("t:noop", {})
    broker = app.new_broker()
    await broker.connect()
    (lease,) = await broker.claim(ClaimParams(["default"], 1, "w", 30))

    async def fails(params: ClaimParams) -> list[Lease]:
        raise durq.BrokerUnavailableError("down")

    broker.claim = fails  # type: ignore[method-assign]
    answers: list[list[bool]] = []
    with pytest.raises(durq.BrokerUnavailableError):
        await complete_then_claim(
            broker,
            [CompleteParams(lease.ref)],
            ClaimParams(["default"], 1, "w", 30),
            answers.append,
        )
    assert answers == [[True]]
    await broker.close()
    await app.close()


async def test_an_idle_workers_ack_rides_in_a_claim_that_fills_its_slot(tmp_path: Path) -> None:
    """A worker with nothing else to claim sends a finished task's ack in a claim at once,
    so the slot it frees takes the next task in the same round trip: a key at its
    concurrency limit hands its slot on without an ack, a wake-up and a claim in turn."""
    await assert_acks_hand_a_limited_slot_on(f"sqlite:///{tmp_path / 'durq.sqlite3'}")


async def test_stop_ends_an_idle_wait_at_once(tmp_path: Path) -> None:
    """An idle fetcher waits on the broker alone; stop() cancels that wait instead of
    leaving the worker until the poll interval (an hour here) runs out."""
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    broker = CountingBroker(app.new_broker())
    executor, fetcher = await fetcher_on(app, broker, concurrency=2, poll_interval=3600)
    while "claim" not in broker.calls:  # its first claim found nothing: now it waits
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    await asyncio.wait_for(fetcher.stop(), 10)
    await executor.close()
    await broker.close()
    await app.close()


async def test_an_idle_workers_plain_acks_go_alone(make_app: AppFactory) -> None:
    """Tasks that come one at a time: each is claimed on its wake-up and its ack goes on its
    own, never in a claim that would find the queue as the last claim left it (on
    PostgreSQL that claim read the claim index again for every task)."""
    app = await make_app(fake_clock=False)
    ran: list[int] = []

    @app.task("t:lone")
    async def lone(payload: dict[str, int]) -> None:
        ran.append(payload["n"])

    broker = CountingBroker(app.new_broker())
    executor, fetcher = await fetcher_on(app, broker, concurrency=4, poll_interval=30)
    for n in range(3):
        await app.enqueue("t:lone", {"n": n})
        for _ in range(1000):
            if broker.calls.count("complete_many") > n:
                break
            await asyncio.sleep(0.01)
    assert ran == [0, 1, 2]
    assert "complete_and_claim" not in broker.calls, broker.calls
    assert broker.calls.count("complete_many") == 3, broker.calls
    await fetcher.stop()
    await executor.close()
    await broker.close()
