"""Acknowledges completed tasks in batches without delaying a lone one.

While the fetcher runs, every ack waits for its next claim: :meth:`Acker.take` hands them
over and one ``complete_and_claim`` round trip stores them and takes the next tasks into the
slots they free (where the broker cannot carry them, the fetcher sends them as
``complete_many`` just ahead of the claim). A busy fetcher claims again as soon as it has
slots. An idle one (:meth:`Acker.idle`: its last claim left slots free) wakes when an ack
arrives whose completion may make work (:func:`may_make_work`) and claims with it at once
(:attr:`Acker.on_arrival`); other acks then go on their own, since a claim after them would
find the queues as the last one left them, and on PostgreSQL it would read the claim index
again for nothing. When the fetcher has stopped or its claims fail, acks go on their own
(:meth:`send_alone`): the first at once, and those that arrive while it is in flight
together in the next ``complete_many``."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sequence

from durq.brokers.contract import Broker
from durq.brokers.params import CompleteParams
from durq.errors import BrokerError

#: An ack waiting to be sent, and the caller waiting for its answer.
Pending = tuple[CompleteParams, "asyncio.Future[bool]"]


def may_make_work(params: CompleteParams) -> bool:
    """Whether storing this completion may make a task claimable: it frees a slot on a
    flow-control key that may hold tasks back, or it creates follow-up tasks (its own, or its
    group's when it is the last member)."""
    return params.limited or bool(params.follow_ups) or params.group is not None


class _Mode(enum.Enum):
    #: Every ack goes on its own (the fetcher stopped, or its claims fail).
    ALONE = "alone"
    #: Every ack waits for the fetcher's next claim.
    CARRY = "carry"
    #: The fetcher waits for work: an ack that may make work waits for the claim it wakes the
    #: fetcher for, the others go on their own.
    IDLE = "idle"


# The modes as plain names: a member looked up on its class goes through EnumType's
# __getattr__ hook (about 1,000 instructions on Python 3.11), and send() asks for every ack.
_ALONE, _CARRY, _IDLE = _Mode.ALONE, _Mode.CARRY, _Mode.IDLE


class Acker:
    def __init__(
        self,
        broker: Broker,
        max_batch: int = 500,
        *,
        on_waiting: Callable[[], None] = lambda: None,
        on_stored: Callable[[Sequence[CompleteParams]], None] = lambda _: None,
    ) -> None:
        self.broker = broker
        self.max_batch = max_batch
        #: Called when an ack starts waiting for the fetcher (it may claim with it now).
        self.on_waiting = on_waiting
        #: Called with the acks the broker answered, before their callers resume.
        self.on_stored = on_stored
        self._waiting: list[Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._mode = _ALONE
        #: Called when an ack starts waiting for the fetcher's claim: an idle fetcher claims
        #: with it at once (the fetcher sets it).
        self.on_arrival: Callable[[], None] = lambda: None

    @property
    def waiting(self) -> int:
        """Acks not yet sent."""
        return len(self._waiting)

    async def complete(self, params: CompleteParams) -> bool:
        """Complete one task; ``False`` if its lease is no longer held."""
        return await self.send(params)

    def send(self, params: CompleteParams) -> asyncio.Future[bool]:
        """:meth:`complete` without a coroutine of its own (the worker's path for every
        task): the future of its answer. It is this ack's alone, never the batch's: a
        caller cancelled while awaiting it cancels only it (:meth:`answer` and :meth:`fail`
        pass it by), and the others of its batch are stored and answered as before."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((params, future))
        if self._mode is _CARRY or (self._mode is _IDLE and may_make_work(params)):
            self.on_arrival()
            self.on_waiting()
        else:
            self._start_flush()
        return future

    def carry(self) -> None:
        """The fetcher's next claim carries the acks that arrive from now on."""
        self._mode = _CARRY

    def idle(self) -> None:
        """The fetcher waits for work with slots free: an ack that may make work
        (:func:`may_make_work`) wakes it to claim with it; others go alone at once, those
        waiting now included."""
        self._mode = _IDLE
        self._start_flush()

    def worth_a_claim(self) -> bool:
        """Whether a waiting ack may make work (:func:`may_make_work`): a fetcher whose
        last claim left slots free claims with it rather than waiting for work."""
        return any(may_make_work(params) for params, _ in self._waiting)

    def send_alone(self) -> None:
        """The fetcher will not claim soon: send what waits, and later acks, at once."""
        self._mode = _ALONE
        self._start_flush()

    def take(self) -> list[Pending]:
        """The waiting acks (up to ``max_batch``), for the fetcher to send with its claim;
        it reports their answers with :meth:`answer` or :meth:`fail`."""
        batch = self._waiting[: self.max_batch]
        del self._waiting[: self.max_batch]
        return batch

    def _take_plain(self) -> list[Pending]:
        """The waiting acks that may not make work (up to ``max_batch``): the others wait
        for the claim the fetcher was woken for."""
        batch: list[Pending] = []
        keep: list[Pending] = []
        for pending in self._waiting:
            if len(batch) < self.max_batch and not may_make_work(pending[0]):
                batch.append(pending)
            else:
                keep.append(pending)
        self._waiting = keep
        return batch

    def _start_flush(self) -> None:
        if self._waiting and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.create_task(self._flush(), name="durq-acker")

    def answer(self, batch: Sequence[Pending], held: Sequence[bool]) -> None:
        if len(held) != len(batch):  # a broker bug must not leave callers waiting
            self.fail(
                batch,
                BrokerError(
                    f"complete_many answered {len(held)} results for {len(batch)} tasks",
                    operation="acker.complete_many",
                ),
            )
            return
        self.on_stored([params for params, _ in batch])
        for (_, future), ok in zip(batch, held, strict=True):
            if not future.done():
                future.set_result(ok)

    @staticmethod
    def fail(batch: Sequence[Pending], exc: BaseException) -> None:
        """Each caller decides whether to retry."""
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)

    async def _flush(self) -> None:
        # Until the fetcher carries acks again (its wait ended: it claims next).
        while self._mode is not _CARRY:
            batch = self.take() if self._mode is _ALONE else self._take_plain()
            if not batch:
                return
            try:
                held = await self.broker.complete_many([params for params, _ in batch])
            except Exception as exc:
                self.fail(batch, exc)
                continue
            self.answer(batch, held)
