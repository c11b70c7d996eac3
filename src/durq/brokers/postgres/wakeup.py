"""Wake-ups on PostgreSQL: LISTEN/NOTIFY.

Receiving, :class:`Listener`: one dedicated connection per broker instance.

Enqueue runs ``pg_notify(channel, queue)`` in its own transaction, so a notification exists
only for committed work. The listener hands each one to the waiters of that queue. It
reconnects with backoff when the server goes away; after every (re)connect it wakes all
waiters, because notifications sent while nobody listened are lost for good.

Sending, :class:`Notifier`: wake-ups for committed enqueues, sent off the caller's path and
coalesced.

An enqueue through the broker's pool commits its insert, hands the queues that got pending
work to the :class:`Notifier` and returns. The notifier sends ``pg_notify`` for them on a
pooled connection of its own, in a statement that writes nothing: never inside the insert's
transaction, because PostgreSQL serialises the commits of all notifying transactions in the
cluster behind one lock held through the WAL flush. Queues handed over while a notify is in
flight ride together in the next one, so concurrent enqueuers send fewer notifications, and a
lone enqueue's notification goes out as soon as the caller's coroutine yields.

One wait is allowed: a notification due while an enqueue of the same broker is writing waits
for that write (at most :data:`HOLD` seconds), which will want one too, and one
notification then covers both. A producer that enqueues one task after another sent one
notify statement per task, each started as the next insert went out; it now sends one per
two tasks (docs/benchmarks.md, "The single enqueue"). A lone enqueue has no write beside it
and waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import psycopg
from psycopg import sql

from durq.brokers.mailbox import Watches

log = logging.getLogger("durq.brokers.postgres")

_BACKOFF_START = 0.1
_BACKOFF_MAX = 5.0
#: The longest a due notification waits for the enqueues writing when it fell due (a few
#: round trips of an insert on a quiet machine): a write held up (a lock wait) delays the
#: wake-ups of other tasks by no more than this.
HOLD = 0.002


class Listener:
    """Runs ``LISTEN channel`` on its own connection and wakes :meth:`wait` callers."""

    def __init__(self, dsn: str, channel: str, connect_kwargs: dict[str, Any]) -> None:
        self._dsn = dsn
        self._channel = channel
        self._connect_kwargs = connect_kwargs
        self._waiters: set[tuple[frozenset[str], asyncio.Event]] = set()
        self._last_seen: dict[str, float] = {}
        self._listening = asyncio.Event()
        self._listen_started = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def start(self) -> None:
        """Start listening in the background (idempotent); claim calls it, so a worker is
        usually listening before its first wait."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"durq-listen:{self._channel}")

    def _seen_since(self, queues: frozenset[str], marks: dict[str, float]) -> bool:
        for queue in queues:
            mark = marks.get(queue)
            if mark is None:  # never claimed from here: nothing to compare with
                continue
            # LISTEN (re)started after that claim: a notification may have been missed.
            if self._listen_started >= mark:
                return True
            seen = self._last_seen.get(queue)
            if seen is not None and seen >= mark:
                return True
        return False

    async def ready(self, timeout: float) -> bool:
        """Start listening if needed and wait (up to ``timeout`` s) until LISTEN runs."""
        self.start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._listening.wait()
        return self._listening.is_set()

    async def wait(self, queues: frozenset[str], timeout: float, marks: dict[str, float]) -> bool:
        """Wait for a notification on ``queues``; ``True`` if one came (or may have been lost).

        Level-triggered: ``marks`` holds when each queue was last claimed from (monotonic); a
        notification that arrived after that returns at once."""
        if not self.listening:
            self.start()
            # Until LISTEN runs nothing is heard: wait for it, then let the caller look again.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._listening.wait()
            return self._listening.is_set()
        if self._seen_since(queues, marks):
            return True
        event = asyncio.Event()
        waiter = (queues, event)
        self._waiters.add(waiter)
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.discard(waiter)

    def poke(self, queues: Iterable[str]) -> None:
        """Wake this process's waiters of ``queues`` now, as their NOTIFY will (it also goes
        to the other processes, a round trip later)."""
        for queue in queues:
            self._wake(queue)

    def _wake(self, queue: str | None) -> None:
        if queue is not None:
            self._last_seen[queue] = time.monotonic()
        for queues, event in self._waiters:
            if queue is None or queue in queues:
                event.set()

    async def _run(self) -> None:
        backoff = _BACKOFF_START
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, **self._connect_kwargs
                )
            except (psycopg.Error, OSError) as exc:
                log.warning("LISTEN connection failed (retrying in %.1fs): %s", backoff, exc)
            else:
                try:
                    async with conn:
                        await conn.execute(
                            sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
                        )
                        self._listen_started = time.monotonic()
                        self._listening.set()
                        self._wake(None)  # anything sent before LISTEN ran is lost: look again
                        backoff = _BACKOFF_START
                        async for note in conn.notifies():
                            self._wake(note.payload)
                except (psycopg.Error, OSError) as exc:
                    log.warning("LISTEN connection lost (reconnecting): %s", exc)
                finally:
                    self._listening.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def close(self) -> None:
        """Stop listening and close the connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._listening.clear()
        self._wake(None)


class EndListener(Listener):
    """Listens on the channel where the ends of tasks are announced (payload: task keys,
    one per line) and wakes their watches; after every (re)connect it wakes them all."""

    def __init__(self, dsn: str, channel: str, connect_kwargs: dict[str, Any]) -> None:
        super().__init__(dsn, channel, connect_kwargs)
        self.watches = Watches()

    def _wake(self, queue: str | None) -> None:
        if queue is None:
            self.watches.notify_all()
        else:
            self.watches.notify(queue.split("\n"))


class Notifier:
    """Sends ``send(queues)`` for every queue added, after the add, at most one call at a time.

    A send due while writes are under way (:meth:`writing`) first waits for those writes, at
    most ``hold`` seconds, so that it carries their queues too."""

    def __init__(self, send: Callable[[list[str]], Awaitable[None]], hold: float = HOLD) -> None:
        self._send = send
        self._hold = hold
        self._pending: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        # Writes begun and ended so far; the send waiting for the writes begun before it.
        self._begun = 0
        self._ended = 0
        self._target = 0
        self._written: asyncio.Future[None] | None = None

    def add(self, queues: Iterable[str]) -> None:
        """Schedule a notification for ``queues`` (their work is committed)."""
        self._pending.update(queues)
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="durq-pg-notify")

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around a write that adds its queues (:meth:`add`) once committed, inside the
        block: a send that falls due meanwhile waits for it. Ends with the block, raised or
        not."""
        self._begun += 1
        try:
            yield
        finally:
            self._ended += 1
            written = self._written
            if written is not None and self._ended >= self._target and not written.done():
                written.set_result(None)

    async def _run(self) -> None:
        while self._pending:
            if self._ended < self._begun:
                # Writes are under way: their notifications are due soon, send one for all.
                # Only those begun by now count, so a stream of writes cannot hold it longer.
                self._target = self._begun
                self._written = asyncio.get_running_loop().create_future()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._written, self._hold)
                self._written = None
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
