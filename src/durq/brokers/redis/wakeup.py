"""Wake-ups on Redis: pub/sub on one channel per queue, and one per task for its end.

A script that makes a task pending publishes on its queue's channel. The broker object
subscribes to the channel of every queue it claims from or waits on (one connection for all,
:class:`~durq.brokers.redis.wire.Subscriber`); messages feed a set of notified queues, so one
that arrives between two waits is kept. Right after (re)subscribing every waiter is woken
once, since messages published while unsubscribed are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from redis import exceptions as rex

from durq.brokers.mailbox import Watch, Watches
from durq.brokers.redis.storage import LONGEST_BLOCK, RedisStorage
from durq.brokers.redis.wire import Command, Subscriber, error, is_error

log = logging.getLogger("durq.brokers.redis")

#: Reconnect backoff bounds of the subscription (seconds).
_LISTEN_BACKOFF = (0.05, 2.0)
#: How long the first claim waits for the subscription (seconds).
_SUBSCRIBE_WAIT = 2.0
#: Seconds between PINGs on an idle subscription (notices a silent peer).
_PING_EVERY = 15.0
#: Marker in the notified set: wake every waiter (after a (re)subscription).
_ALL = "*"


class Wakeups:
    """The wake-up subscription of one broker object and the waiters on it."""

    def __init__(self, storage: RedisStorage) -> None:
        self._storage = storage
        self._notified: set[str] = set()
        self._wake = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        #: Queues whose wake-up channel this broker object subscribes to (claimed or waited
        #: on); their channel names as the server sends them back, mapped to the queue.
        self._watched: set[str] = set()
        self._channel_queue: dict[bytes, str] = {}
        self._sub: Subscriber | None = None

    async def before_claim(self, queues: Sequence[str]) -> None:
        """What was published before this claim is covered by it: only later notifications
        make the next wait return. The subscription itself comes with the first wait (see
        :meth:`watch`), so a worker that never waits this way (one that blocks on a queue's
        token list instead, see :class:`Blocker`) holds no subscriber connection."""
        if any(q in self._watched for q in queues):
            await self.watch(queues, before_claim=True)
        self._notified.difference_update(queues)
        self._notified.discard(_ALL)

    async def wait(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait for a wake-up published by a script that made a task pending in ``queues``.

        The broker object subscribes to the wake-up channel of every queue it claims from or
        waits on (one connection for all); messages feed a set of notified queues, so one
        that arrives between two waits is kept and none is lost after the subscription. Right
        after (re)subscribing every waiter is woken once, since messages published while
        unsubscribed are gone. ``timeout`` bounds the wait."""
        wanted = set(queues)
        if await self.watch(queues, before_claim=False):
            return True  # newly subscribed queues: what was published before is unknown
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            hits = wanted & self._notified
            if hits or _ALL in self._notified:
                self._notified -= hits
                self._notified.discard(_ALL)
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()

    def _notify_local(self, queue: str) -> None:
        self._notified.add(queue)
        self._wake.set()

    def _on_channel_message(self, channel: bytes) -> None:
        queue = self._channel_queue.get(channel)
        if queue is not None:
            self._notified.add(queue)
            self._wake.set()

    async def watch(self, queues: Sequence[str], *, before_claim: bool) -> bool:
        """Make sure wake-ups of ``queues`` are subscribed to. Before a claim this waits
        (briefly) until they are, so every enqueue after the claim started is seen. Returns
        whether queues were added that a waiter may have missed messages of."""
        new = [q for q in dict.fromkeys(queues) if q not in self._watched]
        for q in new:
            channel = self._storage.keys.queue(q).notify  # validates the name
            self._channel_queue[channel.encode()] = q
            self._watched.add(q)
        if self._listener is None or self._listener.done():
            self._subscribed = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(), name="durq-redis-wakeups")
        if not self._subscribed.is_set():
            # The first subscription (it covers every watched queue, new ones included).
            if before_claim:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._subscribed.wait(), _SUBSCRIBE_WAIT)
                    return False
            self._notify_local(_ALL)
            return bool(new)
        sub = self._sub
        if not new or sub is None:
            # None: reconnecting; it subscribes to every watched queue, then wakes all.
            return bool(new)
        try:
            await asyncio.wait_for(
                sub.subscribe([self._storage.keys.queue(q).notify for q in new]), _SUBSCRIBE_WAIT
            )
        except (rex.RedisError, OSError, TimeoutError):
            self._notify_local(_ALL)  # not sure it is subscribed: the next wait returns
        return True

    async def _listen(self) -> None:
        """Keep one subscription to every watched queue's channel; reconnect with backoff
        after errors or a restart, then wake every waiter once."""
        delay = _LISTEN_BACKOFF[0]
        missed = False
        while True:
            sub: Subscriber | None = None
            try:
                sub = await self._storage.wire.subscriber(self._on_channel_message)
                done: set[str] = set()
                while todo := [q for q in self._watched if q not in done]:
                    await sub.subscribe([self._storage.keys.queue(q).notify for q in todo])
                    done.update(todo)
                self._sub = sub
                delay = _LISTEN_BACKOFF[0]
                if missed:
                    # Messages published while we were not subscribed are gone: wake all.
                    self._notify_local(_ALL)
                    missed = False
                self._subscribed.set()
                await sub.watch(_PING_EVERY)
                raise rex.ConnectionError("wake-up subscription lost")
            except (rex.RedisError, OSError, TimeoutError):
                # The server went away; waiters fall back to their timeout meanwhile, and a
                # claim waiting for the first subscription goes on (and fails on its own).
                missed = True
                self._subscribed.set()
            finally:
                self._sub = None
                if sub is not None:
                    sub.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LISTEN_BACKOFF[1])

    async def close(self) -> None:
        """Stop the subscription (idempotent)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener


class Blocker:
    """The connection an idle worker blocks on: ``BLPOP`` on its queues' token lists (the
    scripts' ``wake_workers`` pushes one when tasks become claimable) with the claim script
    of those queues sent right behind it. Redis runs the claim the moment the ``BLPOP`` returns,
    woken or timed out, and sends both replies together: a task enqueued while the worker
    waits reaches it without a round trip after the wake-up (the subscription's way needs
    one: the message, then the claim). An idle worker's wait ends at once when it stops:
    ``CLIENT UNBLOCK`` from the broker's other connection."""

    def __init__(self, storage: RedisStorage) -> None:
        self._storage = storage
        #: Why the server refused this way (an ACL without ``CLIENT ID`` or ``BLPOP``), if it
        #: did: the broker object then waits on the subscription.
        self._refused: str | None = None

    @property
    def available(self) -> bool:
        """A single node (a cluster keeps the subscription's way) that has not refused it."""
        return self._storage.blocking_wire is not None and self._refused is None

    #: The longest block (seconds); the blocking connection's socket timeout allows for it.
    longest = LONGEST_BLOCK

    def _refuse(self, exc: Exception) -> None:
        self._refused = str(exc)
        log.warning("idle workers wait on pub/sub, not BLPOP: the server refused it: %s", exc)

    async def block_then(
        self, token_lists: Sequence[str], seconds: float, then: Command
    ) -> tuple[bool, Any] | None:
        """Block up to ``seconds`` for a token of one of ``token_lists``, then run ``then``: whether a
        token came, and ``then``'s reply (an error reply as a value). ``None`` when the
        server refuses to name the connection (nothing was sent); a refused ``BLPOP`` still
        answers with ``then``'s reply. Either refusal turns this way off."""
        wire = self._storage.blocking_wire
        assert wire is not None
        try:
            await wire.client_id()  # known before it blocks, so that it can be unblocked
        except rex.ResponseError as exc:
            self._refuse(exc)
            return None
        popped, reply = await wire.call_many([("BLPOP", *token_lists, round(seconds, 3)), then])
        if is_error(popped):
            self._refuse(error(popped))
            return False, reply
        return popped is not None, reply

    async def unblock(self) -> None:
        """End a block now; the command behind it still runs and answers. Refused (an ACL
        without ``CLIENT UNBLOCK``), the block ends at its timeout instead."""
        wire = self._storage.blocking_wire
        client = None if wire is None else wire.current_client_id
        if client is not None:
            try:
                await self._storage.command("CLIENT", "UNBLOCK", client)
            except rex.ResponseError as exc:
                log.debug("CLIENT UNBLOCK refused, the wait ends at its timeout: %s", exc)


class EndWatches:
    """Watches of task ends (``App.wait``): one subscriber connection per broker object,
    opened on first use, subscribed to the end channel of every watched task. When that
    connection is lost every watch is woken (messages published meanwhile are gone) and the
    next watch opens another."""

    def __init__(self, storage: RedisStorage) -> None:
        self._storage = storage
        self._watches = Watches()
        self._sub: Subscriber | None = None
        self._lock = asyncio.Lock()

    def _on_message(self, channel: bytes) -> None:
        self._watches.notify([channel.decode()])

    async def _subscriber(self) -> Subscriber:
        async with self._lock:
            sub = self._sub
            if sub is None or sub.closed:
                sub = self._sub = await self._storage.wire.subscriber(self._on_message)
                sub.lost.add_done_callback(lambda _: self._lost(sub))
            return sub

    def _lost(self, sub: Subscriber) -> None:
        if self._sub is sub:
            self._sub = None
        self._watches.notify_all()

    @contextlib.asynccontextmanager
    async def watching(self, queue: str, task_id: str) -> AsyncIterator[Watch]:
        """A watch of the task's end channel, subscribed before the block starts."""
        channel = self._storage.keys.queue(queue).end(task_id)
        watch = Watch()
        self._watches.add(channel, watch)
        sub: Subscriber | None = None
        try:
            try:
                sub = await self._subscriber()
                await sub.subscribe([channel])
            except (rex.RedisError, OSError, TimeoutError) as exc:
                # Unheard: the caller's slow re-check finds the end instead.
                log.warning("cannot subscribe to a task's end (re-checking instead): %s", exc)
            yield watch
        finally:
            if self._watches.discard(channel, watch) and sub is not None:
                sub.unsubscribe([channel])

    async def close(self) -> None:
        """Close the subscriber connection (idempotent)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            sub.close()
