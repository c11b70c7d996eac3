"""Claims tasks into free slots: a batch per round trip, then waits for a wake-up (W8, W11).

It waits on the broker's notification (LISTEN/NOTIFY, pub/sub, in-process event), bounded by
``poll_interval`` so due scheduled tasks and lost notifications are still picked up. Where the
broker can (``CAP_WAIT_AND_CLAIM``: Redis on a single node) the wait and the next claim go together,
and the broker runs the claim as soon as work arrives.

A busy fetcher's claim carries the acker's acknowledgements. Which completions may ride in a
claim is decided here, once, from what the broker declares (``CAP_COMPLETE_AND_CLAIM*``); the
others go as ``complete_many`` ahead of the claim. A broker only stores."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from durq.brokers.contract import (
    CAP_COMPLETE_AND_CLAIM,
    CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
    CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS,
    CAP_WAIT_AND_CLAIM,
    Broker,
    CompleteAndClaim,
    WaitAndClaim,
)
from durq.brokers.params import Claimed, ClaimParams, CompleteParams, Lease
from durq.errors import BrokerUnavailableError
from durq.worker.acker import Pending
from durq.worker.courtesy import LoopCourtesy
from durq.worker.executor import Executor

log = logging.getLogger("durq.worker")

T = TypeVar("T")


def queue_order(weights: Mapping[str, int], strict: bool, rng: random.Random) -> list[str]:
    """The order to take queues in for one claim.

    Strict: highest weight first, always. Weighted: a random order where each queue comes
    first with probability proportional to its weight, so no queue starves."""
    if strict or len(weights) == 1:
        return sorted(weights, key=lambda q: -weights[q])
    remaining = dict(weights)
    order: list[str] = []
    while remaining:
        pick = rng.uniform(0, sum(remaining.values()))
        for queue, weight in remaining.items():  # noqa: B007 - the pick is used below
            pick -= weight
            if pick <= 0:
                break
        order.append(queue)
        del remaining[queue]
    return order


def rides_in_claim(
    capabilities: frozenset[str], items: Sequence[CompleteParams], claim: ClaimParams
) -> bool:
    """Whether the completions ``items`` can ride in ``claim``, one ``complete_and_claim``
    round trip, on a broker with ``capabilities``; else they go as ``complete_many``, then
    the claim (two round trips, the completions still stored first)."""
    if not items or claim.limit <= 0 or not claim.queues:
        return False
    if CAP_COMPLETE_AND_CLAIM not in capabilities:
        return False
    if CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS not in capabilities and any(
        p.follow_ups or p.group is not None for p in items
    ):
        return False
    first = claim.queues[0]
    return CAP_COMPLETE_AND_CLAIM_ANY_QUEUE in capabilities or all(
        p.lease.queue == first for p in items
    )


async def complete_then_claim(
    broker: Broker,
    items: Sequence[CompleteParams],
    claim: ClaimParams,
    stored: Callable[[list[bool]], None],
) -> list[Lease]:
    """Store the completions ``items``, then claim: one round trip when they ride in the
    claim (:func:`rides_in_claim`), else ``complete_many`` and then ``claim``.

    Either way the completions are stored before the claim runs, so it may fill their slots
    and a crash never leaves more unacknowledged leases than slots. ``stored`` gets their
    answers (as ``complete_many``'s) as soon as the broker gives them: before a claim sent
    on its own, which may still fail."""
    if rides_in_claim(broker.capabilities, items, claim):
        held, leases = await cast(CompleteAndClaim, broker).complete_and_claim(items, claim)
        stored(held)
        return leases
    if items:
        stored(await broker.complete_many(items))
    return await broker.claim(claim)


class Fetcher:
    def __init__(
        self,
        broker: Broker,
        executor: Executor,
        *,
        queues: Mapping[str, int],
        strict: bool,
        worker_id: str,
        lease_seconds: float,
        poll_interval: float,
        max_tasks: int | None = None,
        burst: bool = False,
        courtesy: LoopCourtesy | None = None,
    ) -> None:
        self.broker = broker
        self.executor = executor
        self.queues = dict(queues)
        self.strict = strict
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self._rng = random.Random()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: The broker's wait for work while the fetcher is idle; stopping and an arriving ack
        #: cancel it (one task a wait, not one per thing it waits for).
        self._waiter: asyncio.Future[Any] | None = None
        #: Claim no more than this many tasks in all (then :attr:`done`), ``None``: no limit.
        self.max_tasks = max_tasks
        #: Stop (:attr:`done`) instead of waiting once nothing is claimable and no task of
        #: this worker runs; see :meth:`_drained`.
        self.burst = burst
        #: Tasks claimed since start.
        self.claimed = 0
        #: Set when the fetcher ended by itself (max_tasks, burst, :meth:`retire`), not by stop().
        self.done = asyncio.Event()
        self._retiring = False
        self._promoted = False
        #: Holds claims while the loop this worker shares with a web server is late.
        self.courtesy = courtesy

    def start(self) -> None:
        self._stop.clear()
        self.executor.acker.on_arrival = self._interrupt
        self._task = asyncio.create_task(self._run(), name="durq-fetcher")

    async def stop(self) -> None:
        """Stop claiming. Never interrupts a claim in flight (its leases would be orphaned)."""
        self._stop.set()
        self.executor.slot_freed.set()
        self._interrupt()
        if self._task is not None:
            await self._task
            self._task = None

    def retire(self) -> None:
        """Claim nothing more, for good; :attr:`done` is set once the loop has ended."""
        self._retiring = True
        self._stop.set()
        self.executor.slot_freed.set()
        self._interrupt()

    async def _run(self) -> None:
        try:
            await self._loop()
        finally:
            self.executor.acker.send_alone()
            if self._retiring:
                self.done.set()

    async def _loop(self) -> None:
        executor, acker = self.executor, self.executor.acker
        failures = 0
        while not self._stop.is_set():
            if self.max_tasks is not None and self.claimed >= self.max_tasks:
                log.info("claimed %d tasks (the limit): claiming no more", self.claimed)
                self._retiring = True
                return
            # Acks of finished tasks wait for this loop's next claim, which stores them first
            # and so may fill their slots: one round trip where ack and claim took two.
            acker.carry()
            if executor.free_slots + acker.waiting <= 0:
                executor.slot_freed.clear()
                if executor.free_slots + acker.waiting <= 0:
                    await executor.slot_freed.wait()
                continue
            if self.courtesy is not None and self.courtesy.busy:
                # Requests first: acks go now (their slots must not wait for the hold), the
                # claim once the loop is on time again.
                acker.send_alone()
                await self.courtesy.wait(self._stop)
                if self._stop.is_set():
                    continue
                acker.carry()
            acks = acker.take()
            # A slot is a lease held and not acknowledged (docs/guarantees.md): the tasks
            # whose acks ride in this claim give theirs to it.
            free = executor.free_slots + len(acks)
            if self.max_tasks is not None:
                free = min(free, self.max_tasks - self.claimed)
            order = queue_order(self.queues, self.strict, self._rng)
            params = ClaimParams(order, free, self.worker_id, self.lease_seconds)
            try:
                leases = await self._ack_and_claim(acks, params)
                failures = 0
            except asyncio.CancelledError:
                # Whether the acks were stored is unknown: their attempts send them again.
                acker.fail(acks, BrokerUnavailableError(operation="fetcher.complete_and_claim"))
                raise
            except Exception as exc:
                acker.fail(acks, exc)  # each attempt retries its own ack as before
                acker.send_alone()
                failures += 1
                delay = min(0.1 * 2**failures, 5.0)
                if isinstance(exc, BrokerUnavailableError):
                    log.warning("cannot claim tasks (%s); retrying in %.1fs", exc, delay)
                else:  # a dead fetcher would leave a live worker that takes nothing
                    log.exception("claim failed; retrying in %.1fs", delay)
                await self._sleep(delay)
                continue
            self.claimed += len(leases)
            for lease in leases:
                executor.submit(lease)
            if self.burst and len(leases) < free and not self._stop.is_set():
                if await self._drained(leases):
                    log.info("burst: nothing left to claim and nothing running")
                    self._retiring = True
                    return
                continue
            if leases:
                # One loop turn for the new attempts to start (short ones also end) before
                # the next claim is decided: an ack that was waiting then rides with theirs
                # instead of going ahead in a claim of one slot; without it a PostgreSQL
                # worker with limited tasks alternated claims of 49 and of 1 (limits.py).
                await asyncio.sleep(0)
            if len(leases) < free and not self._stop.is_set() and not acker.worth_a_claim():
                # The claim left slots free: the queues had nothing more for it. Idle until
                # work comes, or until an attempt ends whose ack may make some
                # (acker.may_make_work): that ack then goes at once, in a claim, so the slot
                # it frees takes the next task in the same round trip (a key at its
                # concurrency limit frees its slots this way) rather than the ack, the
                # wake-up it sends, and a claim one after another. Other acks go alone: a
                # claim with them would find the queues as this one left them (and on
                # PostgreSQL read the claim index again for nothing).
                acker.idle()
                await self._idle(order, self._timeout_after(leases))

    async def _drained(self, leases: list[Lease]) -> bool:
        """Burst mode, after a claim that left slots free: ``True`` once nothing is claimable
        and no task of this worker runs. While tasks run, wait for one to end (its follow-ups
        or a retry due now may make work), then claim again; when none runs, promote what is
        due now (scheduled, retries) once and claim again before deciding."""
        executor = self.executor
        if leases:
            self._promoted = False
        if executor.running:
            executor.slot_freed.clear()
            if executor.running and not executor.acker.waiting:
                await executor.slot_freed.wait()
            return False
        if not self._promoted:
            self._promoted = True
            try:
                await self.broker.promote_due()
            except Exception as exc:  # the promoter retries; the next claim reports an outage
                log.warning("burst: promoting due tasks failed: %s", exc)
            return False
        return True

    def _timeout_after(self, leases: list[Lease]) -> float:
        """How long to wait for work after a claim answered ``leases``."""
        timeout = self.poll_interval
        if isinstance(leases, Claimed) and leases.wake_at is not None:
            # A task held by a rate limit: look again when its token comes.
            until = leases.wake_at - self.broker.clock.now()
            timeout = min(timeout, max(0.001, until))
        return timeout

    async def _idle(self, order: list[str], timeout: float) -> None:
        """Wait for work, then let the loop claim it; where the broker claims in the same
        step, :meth:`_wait_and_claim` instead."""
        # Not for a worker that gives way to requests: a claim made inside the broker's wait
        # could not be held.
        if (
            self.courtesy is None
            and CAP_WAIT_AND_CLAIM in self.broker.capabilities
            and await self._wait_and_claim(order, timeout)
        ):
            return
        await self._wait(self.broker.wait_for_work(order, timeout))

    async def _wait_and_claim(self, order: list[str], timeout: float) -> bool:
        """Start the attempts the broker claims as work comes, and wait on while its claims
        leave slots free (the queue is empty again). Acks of attempts that end meanwhile go
        on their own: the wait is not interrupted for them. ``False`` when the broker does
        not serve these queues that way (nothing was waited for)."""
        broker, executor = cast(WaitAndClaim, self.broker), self.executor
        executor.acker.send_alone()
        while not self._stop.is_set() and (free := executor.free_slots) > 0:
            params = ClaimParams(order, free, self.worker_id, self.lease_seconds)
            done, leases = await self._wait(broker.wait_and_claim(params, timeout))
            if not done:
                return True
            if leases is None:
                executor.acker.idle()  # the usual wait: acks that may make work ride again
                return False
            for lease in leases:
                executor.submit(lease)
            if len(leases) >= free:
                return True
            timeout = self._timeout_after(leases)
        return True

    async def _ack_and_claim(self, acks: Sequence[Pending], params: ClaimParams) -> list[Lease]:
        acker = self.executor.acker
        return await complete_then_claim(
            self.broker, [ack for ack, _ in acks], params, lambda held: acker.answer(acks, held)
        )

    async def _wait(self, wait: Awaitable[T]) -> tuple[bool, T | None]:
        """Await the broker's ``wait`` as a task that :meth:`_interrupt` may cancel: whether
        it answered, and its answer. A failed wait is logged and followed by a pause of
        ``poll_interval`` (the claim that comes next reports a broker that stays away)."""
        waiter = asyncio.ensure_future(wait)
        self._waiter = waiter
        try:
            # Awaited directly (the fetcher resumes one loop turn after the answer): a
            # CancelledError is then the waiter's, unless this task is being cancelled.
            answer = await waiter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return False, None
        except Exception as exc:
            log.debug("waiting for work failed: %s", exc)
            await self._sleep(self.poll_interval)
            return False, None
        finally:
            self._waiter = None
            if not waiter.done():
                waiter.cancel()
        return True, answer

    def _interrupt(self) -> None:
        """End the wait for work now: the fetcher stops, or an ack wants its claim."""
        if self._waiter is not None:
            self._waiter.cancel()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            pass
