"""Concurrent enqueues of one process share round trips.

A web server's handlers call ``enqueue`` at the same time, each for one task. The SQLite,
PostgreSQL and Redis brokers send these through a :class:`~durq.Coalescer`: the first call
of an idle moment goes at once, alone; calls that arrive while a round trip is in flight go
together, in arrival order, as one ``enqueue_many`` (one pipelined script on Redis, one
multi-row insert on PostgreSQL, one transaction on SQLite).

Every caller keeps the answer it would have had alone: its own :class:`TaskInfo`, or its own
:class:`~durq.TaskIDConflictError` / :class:`~durq.DuplicateTaskError` (two calls with the
same task id in one batch: the first is created, the second refused, as one after the
other), from the per-item outcomes of ``enqueue_many``; the coalescer sends a batch that
fails as a whole again call by call, except on :class:`~durq.BrokerUnavailableError`.

An enqueue inside a caller's transaction (``connection=``) never comes here: it belongs to
that transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from durq.brokers.params import EnqueueOutcome, EnqueueParams
from durq.coalescer import MAX_BATCH, Coalescer
from durq.errors import BrokerUnavailableError
from durq.task import TaskInfo

SendOne = Callable[[EnqueueParams], Awaitable[TaskInfo]]
SendMany = Callable[[Sequence[EnqueueParams]], Awaitable[list[EnqueueOutcome]]]


def enqueue_coalescer(
    one: SendOne, many: SendMany, *, max_batch: int = MAX_BATCH, in_flight: int = 1
) -> Coalescer[EnqueueParams, TaskInfo]:
    """One broker's single enqueues, coalesced while a round trip is in flight.

    ``one`` sends a single task and raises its refusal; ``many`` sends several and returns
    one :class:`EnqueueOutcome` per item, in order (a broker's ``enqueue_many``).
    ``in_flight``: round trips under way at once (see :class:`~durq.Coalescer`)."""

    async def answers(items: Sequence[EnqueueParams]) -> list[TaskInfo | BaseException]:
        return [
            o.info if o.info is not None else (o.error or BrokerUnavailableError("no answer"))
            for o in await many(items)
        ]

    return Coalescer(one, answers, max_batch=max_batch, in_flight=in_flight)


__all__ = ["MAX_BATCH", "enqueue_coalescer"]
