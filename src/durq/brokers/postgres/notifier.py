"""Wake-ups for committed enqueues, sent off the caller's path and coalesced.

An enqueue through the broker's pool commits its insert, hands the queues that got pending
work to the :class:`Notifier` and returns. The notifier sends ``pg_notify`` for them on a
pooled connection of its own, in a statement that writes nothing: never inside the insert's
transaction, because PostgreSQL serialises the commits of all notifying transactions in the
cluster behind one lock held through the WAL flush. Queues handed over while a notify is in
flight ride together in the next one, so concurrent enqueuers send fewer notifications, and a
lone enqueue's notification goes out as soon as the caller's coroutine yields (it is never
delayed on purpose)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger("durq.brokers.postgres")


class Notifier:
    """Sends ``send(queues)`` for every queue added, after the add, at most one call at a time."""

    def __init__(self, send: Callable[[list[str]], Awaitable[None]]) -> None:
        self._send = send
        self._pending: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, queues: Iterable[str]) -> None:
        """Schedule a notification for ``queues`` (their work is committed)."""
        self._pending.update(queues)
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="durq-pg-notify")

    async def _run(self) -> None:
        while self._pending:
            queues = sorted(self._pending)
            self._pending.clear()
            try:
                await self._send(queues)
            except Exception as exc:
                # The tasks are committed: never report them as not written. Workers find
                # them on their next bounded wait.
                log.warning("NOTIFY after enqueue failed (workers will poll): %s", exc)

    async def flush(self) -> None:
        """Wait until every notification added so far has been sent (or has failed)."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)
