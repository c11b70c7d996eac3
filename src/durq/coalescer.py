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
    """The calls of one event loop: whether a round trip is in flight, and who waits."""

    __slots__ = ("busy", "sender", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.waiting: list[tuple[T, asyncio.Future[R]]] = []
        #: The task sending the current batch (kept referenced while it runs).
        self.sender: asyncio.Task[None] | None = None


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
    """

    def __init__(
        self,
        one: Callable[[T], Awaitable[R]],
        many: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
        *,
        max_batch: int = MAX_BATCH,
        apart: Callable[[T], Hashable] | None = None,
        fail_together: tuple[type[BaseException], ...] = (BrokerUnavailableError,),
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._one = one
        self._many = many
        self._max = max_batch
        self._apart = apart
        self._together = fail_together
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane[T, R]] = (
            weakref.WeakKeyDictionary()
        )

    async def send(self, item: T) -> R:
        """Send ``item``: alone if nothing is in flight, else in the next batch."""
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = _Lane()
        if not lane.busy:
            lane.busy = True
            try:
                return await self._one(item)
            finally:
                self._next(lane, 1)
        future: asyncio.Future[R] = loop.create_future()
        lane.waiting.append((item, future))
        return await future

    def _next(self, lane: _Lane[T, R], answered: int) -> None:
        """A round trip that ``answered`` calls ended.

        One call, nothing waiting: idle at once, so a caller that sends one item after
        another always sends alone, at once. Otherwise the callers just answered run next
        in this pass of the loop and often call again at once: let them, then send all that
        waits as one batch (a callback one pass later, not a timer). Sending or going idle
        at once would leave them to a round trip of their own: with 50 callers on Redis,
        batches of 1 and 49 (or 1 and 50) in turn instead of 50 each time."""
        if answered <= 1 and not lane.waiting:
            lane.busy = False
            lane.sender = None
            return
        asyncio.get_running_loop().call_soon(self._flush, lane)

    def _flush(self, lane: _Lane[T, R]) -> None:
        """Send what waits, or become idle."""
        batch: list[tuple[T, asyncio.Future[R]]] = []
        later: list[tuple[T, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        for entry in lane.waiting:
            item, future = entry
            if future.done():  # its caller gave up (cancelled) while waiting: not sent
                continue
            key = self._apart(item) if self._apart is not None else None
            if len(batch) >= self._max or (key is not None and key in keys):
                later.append(entry)
                continue
            batch.append(entry)
            if key is not None:
                keys.add(key)
        lane.waiting = later
        if batch:
            lane.sender = asyncio.get_running_loop().create_task(self._send(lane, batch))
        else:
            lane.busy = False
            lane.sender = None

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
