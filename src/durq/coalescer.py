"""Concurrent calls of one process share round trips: :class:`Coalescer`.

A web server's handlers each make one call (enqueue one task, save one order) at the same
time. A coalescer sends the first call of an idle moment at once, alone: no timer, so a lone
call waits for nothing but its own round trip. Calls that arrive while a round trip is in
flight wait for it to come back and then go together, in arrival order, as one "send many".
So the busier the process, the larger the batches, and an idle one pays nothing.

durq's brokers send concurrent ``enqueue`` calls through one; a service can put one in front
of its own writes (the reference service commits the orders of concurrent requests in one
transaction with it, examples/insurance/store.py).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from durq.errors import BrokerUnavailableError

T = TypeVar("T")
R = TypeVar("R")

#: The most calls sent in one batch unless told otherwise; more wait for the next one.
MAX_BATCH = 1000


class _Lane(Generic[T, R]):
    """The calls of one event loop: the batches in flight, and who waits."""

    __slots__ = ("carried", "due", "flying", "senders", "waiting")

    def __init__(self) -> None:
        #: Round trips in flight, and the items they carry.
        self.flying = 0
        self.carried = 0
        #: The flush scheduled for the next pass of the loop, if any.
        self.due: asyncio.Handle | None = None
        self.waiting: list[tuple[T, asyncio.Future[R]]] = []
        #: The tasks sending the current batches (kept referenced while they run).
        self.senders: set[asyncio.Task[None]] = set()

    @property
    def idle(self) -> bool:
        return not self.flying and self.due is None and not self.waiting


class Coalescer(Generic[T, R]):
    """Concurrent calls of one process, coalesced while a round trip is in flight.

    ``one(item)`` sends a single item and returns its answer or raises its error.
    ``many(items)`` sends several in one round trip and returns one entry per item, in
    order: the item's answer, or the exception that item alone would have raised (an
    exception *instance* as an entry, not raised). :meth:`send` is what callers await.

    Every caller gets the answer it would have had alone:

    * a batch that ``many`` refuses as a whole (it raises) is sent again item by item with
      ``one``, so an error that belongs to one item reaches that caller only; except the
      ``fail_together`` errors (by default :class:`durq.BrokerUnavailableError`), which
      no item of the batch would have escaped: every caller of the batch gets that one;
    * ``apart(item)``, when given, keys items that must not share a batch (a later call
      has to see what an earlier one wrote): an item whose key is already in the batch
      waits for the next one, keeping its place;
    * a caller cancelled while it waits is not sent; one cancelled while its batch is in
      flight just stops waiting (the batch still goes, for the others).

    Calls of different event loops never share a batch: each loop has a lane of its own,
    so one coalescer may serve a program that runs several loops (one at a time each).

    At most ``max_batch`` items go in one ``many``; more wait for the next round trip.

    ``gather``: the first call of an idle moment waits one pass of the event loop (no timer)
    before it is sent, with the calls made in that same pass. It suits callers that wake
    together, as the handlers of one worker do after a claim: sent alone, the first one's
    round trip would hold the others back for one round trip each time.

    ``in_flight`` round trips may be under way at once (1 by default). More than one suits a
    backend that runs what it is sent in the order sent, on one connection (a pipelined
    Redis connection): it works on one batch while this process answers the callers of
    another and gathers the next, instead of each side waiting for the other. The waiting
    calls are then shared out so that the batches in flight carry about as many each. A
    batch refused as a whole is then sent again item by item after the next batch may have
    run (so ``apart`` needs ``in_flight=1``).
    """

    def __init__(
        self,
        one: Callable[[T], Awaitable[R]],
        many: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
        *,
        max_batch: int = MAX_BATCH,
        apart: Callable[[T], Hashable] | None = None,
        fail_together: tuple[type[BaseException], ...] = (BrokerUnavailableError,),
        in_flight: int = 1,
        gather: bool = False,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        if in_flight > 1 and apart is not None:
            # A batch refused as a whole goes again item by item, after the next batch may
            # have run: an item kept apart would no longer surely see its elder's write.
            raise ValueError("apart needs in_flight=1")
        self._one = one
        self._many = many
        self._max = max_batch
        self._apart = apart
        self._together = fail_together
        self._depth = in_flight
        self._gather = gather
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane[T, R]] = (
            weakref.WeakKeyDictionary()
        )

    async def send(self, item: T) -> R:
        """Send ``item``: alone if nothing is in flight, else in the next batch."""
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = _Lane()
        if lane.idle and not self._gather:
            lane.flying = lane.carried = 1
            try:
                return await self._one(item)
            finally:
                self._next(lane, 1)
        future: asyncio.Future[R] = loop.create_future()
        lane.waiting.append((item, future))
        if lane.flying < self._depth and lane.due is None:
            # Room for another round trip: the others calling in this pass join it.
            lane.due = loop.call_soon(self._flush, lane)
        return await future

    def _next(self, lane: _Lane[T, R], answered: int) -> None:
        """A round trip that ``answered`` calls ended.

        One call, nothing else in flight or waiting: idle at once, so a caller that sends
        one item after another always sends alone, at once. Otherwise the callers just
        answered run next in this pass of the loop and often call again at once: let them,
        then send what waits (a callback one pass later, not a timer). Sending or going
        idle at once would leave them to a round trip of their own: with 50 callers on
        Redis, batches of 1 and 49 (or 1 and 50) in turn instead of 50 each time."""
        lane.flying -= 1
        lane.carried -= answered
        if answered <= 1 and not lane.waiting:
            return
        if lane.due is not None:
            # A flush already due would run before these callers call again: a batch of
            # its share of the calls waiting now, and theirs later in a batch apart.
            lane.due.cancel()
        lane.due = asyncio.get_running_loop().call_soon(self._flush, lane)

    def _flush(self, lane: _Lane[T, R]) -> None:
        """Send what waits (its share, with several round trips in flight), or nothing."""
        lane.due = None
        if lane.flying >= self._depth:
            return  # the next answer flushes
        live = [entry for entry in lane.waiting if not entry[1].done()]  # not given up
        # Several round trips in flight: this one takes its share of all the calls under
        # way, so that the batches keep even sizes (the first call of a busy moment goes
        # alone, and the next batch would otherwise carry all the others, every time).
        share = -(-(len(live) + lane.carried) // self._depth)
        room = min(self._max, max(share, 1))
        batch: list[tuple[T, asyncio.Future[R]]] = []
        later: list[tuple[T, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        for entry in live:
            key = self._apart(entry[0]) if self._apart is not None else None
            if len(batch) >= room or (key is not None and key in keys):
                later.append(entry)
                continue
            batch.append(entry)
            if key is not None:
                keys.add(key)
        lane.waiting = later
        if not batch:
            return
        lane.flying += 1
        lane.carried += len(batch)
        sender = asyncio.get_running_loop().create_task(self._send(lane, batch))
        lane.senders.add(sender)
        sender.add_done_callback(lane.senders.discard)
        if later and lane.flying < self._depth:
            lane.due = asyncio.get_running_loop().call_soon(self._flush, lane)

    async def _send(self, lane: _Lane[T, R], batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            if len(batch) == 1:
                await self._each(batch)
                return
            try:
                answers = await self._many([item for item, _ in batch])
            except self._together as exc:
                for _, future in batch:
                    _settle(future, exc)
                return
            except Exception:
                # Something in the batch was refused as a whole (a bad value, a check):
                # again one by one, so only the call it belongs to fails.
                await self._each(batch)
                return
            if len(answers) != len(batch):  # a bug in ``many`` must not leave callers waiting
                error = RuntimeError(f"{len(answers)} answers for a batch of {len(batch)}")
                for _, future in batch:
                    _settle(future, error)
                return
            for (_, future), answer in zip(batch, answers, strict=True):
                _settle(future, answer)
        except Exception as exc:  # settle every caller, whatever went wrong
            for _, future in batch:
                _settle(future, exc)
        finally:
            for _, future in batch:  # this task was cancelled (the loop is closing)
                if not future.done():
                    future.cancel()
            self._next(lane, len(batch))

    async def _each(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        """Each item alone, all at once (their round trips overlap where the backend can)."""
        answers = await asyncio.gather(
            *(self._one(item) for item, _ in batch), return_exceptions=True
        )
        for (_, future), answer in zip(batch, answers, strict=True):
            _settle(future, answer)


def _settle(future: asyncio.Future[R], answer: R | BaseException) -> None:
    """Give a waiting caller its answer or its error (a cancelled one: cancelled)."""
    if future.done():  # the caller gave up while its batch was in flight
        return
    if isinstance(answer, asyncio.CancelledError):
        future.cancel()
    elif isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)


__all__ = ["MAX_BATCH", "Coalescer"]
