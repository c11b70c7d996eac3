"""Concurrent enqueues of one process share round trips.

A web server's handlers call ``enqueue`` at the same time, each for one task. A broker sends
the first call of an idle moment at once, alone: no timer, so a lone call waits for nothing
but its own round trip. Calls that arrive while a round trip is in flight wait for it to
come back and then go together, in arrival order, as one ``enqueue_many`` (one pipelined
script on Redis, one multi-row insert on PostgreSQL, one transaction on SQLite). So the
busier the process, the larger the batches, and an idle one pays nothing.

Every caller keeps the answer it would have had alone: its own :class:`TaskInfo`, or its own
:class:`~durq.TaskIDConflictError` / :class:`~durq.DuplicateTaskError` (two calls with the
same task id in one batch: the first is created, the second refused, as one after the
other). A batch that fails as a whole is sent again call by call, so an error that belongs
to one call reaches that caller only; only :class:`~durq.BrokerUnavailableError`, which no
call of the batch would have escaped, goes to every caller at once.

An enqueue inside a caller's transaction (``connection=``) never comes here: it belongs to
that transaction.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence

from durq.brokers.base import EnqueueOutcome, EnqueueParams
from durq.errors import BrokerUnavailableError
from durq.task import TaskInfo

SendOne = Callable[[EnqueueParams], Awaitable[TaskInfo]]
SendMany = Callable[[Sequence[EnqueueParams]], Awaitable[list[EnqueueOutcome]]]

#: The most calls sent in one batch; more wait for the next round trip.
MAX_BATCH = 1000

_Waiting = list[tuple[EnqueueParams, "asyncio.Future[TaskInfo]"]]


class _Lane:
    """The calls of one event loop: whether a round trip is in flight, and who waits."""

    __slots__ = ("busy", "sender", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.waiting: _Waiting = []
        #: The task sending the current batch (kept referenced while it runs).
        self.sender: asyncio.Task[None] | None = None


class EnqueueBatcher:
    """One broker's single enqueues, coalesced while a round trip is in flight.

    ``one`` sends a single task and raises its refusal; ``many`` sends several and returns
    one :class:`EnqueueOutcome` per item, in order (a broker's ``enqueue_many``)."""

    def __init__(self, one: SendOne, many: SendMany, *, max_batch: int = MAX_BATCH) -> None:
        self._one = one
        self._many = many
        self._max = max_batch
        # Per event loop: a broker object may serve more than one (one at a time each).
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane] = (
            weakref.WeakKeyDictionary()
        )

    async def enqueue(self, params: EnqueueParams) -> TaskInfo:
        """Create one task, alone if nothing is in flight, else in the next batch."""
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = _Lane()
        if not lane.busy:
            lane.busy = True
            try:
                return await self._one(params)
            finally:
                self._next(lane, 1)
        future: asyncio.Future[TaskInfo] = loop.create_future()
        lane.waiting.append((params, future))
        return await future

    def _next(self, lane: _Lane, answered: int) -> None:
        """A round trip that ``answered`` calls ended.

        One call, nothing waiting: idle at once, so a caller that enqueues one task after
        another always sends alone, at once. Otherwise the callers just answered run next
        in this pass of the loop and often enqueue again at once: let them, then send all
        that waits as one batch (a callback one pass later, not a timer). Sending or going
        idle at once would leave them to a round trip of their own: with 50 callers on
        Redis, batches of 1 and 49 (or 1 and 50) in turn instead of 50 each time."""
        if answered <= 1 and not lane.waiting:
            lane.busy = False
            lane.sender = None
            return
        asyncio.get_running_loop().call_soon(self._flush, lane)

    def _flush(self, lane: _Lane) -> None:
        """Send what waits, or become idle."""
        # Calls whose caller gave up (cancelled) while waiting are not sent.
        waiting = [(p, f) for p, f in lane.waiting[: self._max] if not f.done()]
        del lane.waiting[: self._max]
        if waiting:
            lane.sender = asyncio.get_running_loop().create_task(self._send(lane, waiting))
        elif lane.waiting:  # only cancelled calls in this slice; look at the rest
            self._flush(lane)
        else:
            lane.busy = False
            lane.sender = None

    async def _send(self, lane: _Lane, batch: _Waiting) -> None:
        try:
            if len(batch) == 1:
                await self._each(batch)
                return
            try:
                outcomes = await self._many([p for p, _ in batch])
            except BrokerUnavailableError as exc:
                for _, future in batch:
                    _fail(future, exc)
                return
            except Exception:
                # Something in the batch was refused as a whole (a bad value, a check):
                # again one by one, so only the call it belongs to fails.
                await self._each(batch)
                return
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.done():
                    continue
                if outcome.info is not None:
                    future.set_result(outcome.info)
                else:
                    _fail(future, outcome.error or BrokerUnavailableError("no answer"))
        finally:
            for _, future in batch:  # this task was cancelled (the loop is closing)
                if not future.done():
                    future.cancel()
            self._next(lane, len(batch))

    async def _each(self, batch: _Waiting) -> None:
        results = await asyncio.gather(*(self._one(p) for p, _ in batch), return_exceptions=True)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                _fail(future, result)
            else:
                future.set_result(result)


def _fail(future: asyncio.Future[TaskInfo], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)


__all__ = ["MAX_BATCH", "EnqueueBatcher"]
