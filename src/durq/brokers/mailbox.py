"""In-process wake-ups: an enqueue wakes every idle waiter of this process on the same store,
and the end of a task wakes the :class:`Watch` of every ``wait`` for it.

Several broker instances of one process (an app's client and its worker, or several workers)
may share a store (an SQLite file, a ``memory://`` name); each has a :class:`Mailbox`,
registered under the store's key. Notifications come from whichever thread committed, so
waking goes through ``loop.call_soon_threadsafe``. Other processes are not reached from here
(SQLite polls ``PRAGMA data_version`` for them).

Wake-ups are level-triggered: a notification that arrives while nobody waits is kept in the
mailbox until the broker's next claim of that queue, so an enqueue that lands between a claim
that came back short and the next wait is never slept through.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Iterable


class Waiter:
    """One coroutine inside ``wait_for_work``: its loop, its event and the queues it serves."""

    __slots__ = ("event", "loop", "queues")

    def __init__(self, loop: asyncio.AbstractEventLoop, queues: Iterable[str]) -> None:
        self.loop = loop
        self.event = asyncio.Event()
        self.queues = frozenset(queues)

    def wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # its loop is closed: nobody is waiting any more
            pass


class Mailbox:
    """One broker's wake-ups: queues notified since its last claim, and its parked waiters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._waiters: set[Waiter] = set()

    def post(self, queues: frozenset[str]) -> None:
        """Work may be claimable in ``queues``: remember it and wake matching waiters."""
        with self._lock:
            self._pending |= queues
            targets = [w for w in self._waiters if not w.queues.isdisjoint(queues)]
        for waiter in targets:
            waiter.wake()

    def take(self, queues: Iterable[str]) -> bool:
        """Consume the notifications for ``queues``; ``True`` if there were any."""
        wanted = set(queues)
        with self._lock:
            hit = not self._pending.isdisjoint(wanted)
            self._pending -= wanted
        return hit

    def park(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.add(waiter)

    def unpark(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.discard(waiter)


_lock = threading.Lock()
# Weak: a broker that is dropped without close() leaves nothing behind.
_boxes: dict[str, weakref.WeakSet[Mailbox]] = {}


def register(key: str) -> Mailbox:
    """A new mailbox for a broker on the store ``key``."""
    box = Mailbox()
    with _lock:
        _boxes.setdefault(key, weakref.WeakSet()).add(box)
    return box


def notify(key: str, queues: Iterable[str]) -> None:
    """Tell every broker of this process on ``key`` that ``queues`` may have work."""
    wanted = frozenset(queues)
    if not wanted:
        return
    with _lock:
        boxes = list(_boxes.get(key, ()))
    for box in boxes:
        box.post(wanted)


# -- the end of a task: what ``App.wait`` watches -------------------------------------------------


def end_key(queue: str, task_id: str) -> str:
    """The key of one task in :class:`Watches` (names hold no space, so keys never clash)."""
    return f"{queue} {task_id}"


class Watch:
    """One wait's subscription to the end of one task. Level-triggered: a notification that
    arrives before :meth:`wait` (from any thread) is kept until a ``wait`` takes it."""

    __slots__ = ("_event", "_loop")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def notify(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # its loop is closed: nobody is waiting any more
            pass

    async def wait(self, timeout: float) -> bool:
        """``True`` once notified (taking the notification), ``False`` after ``timeout`` s."""
        if not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, timeout)):
                    await self._event.wait()
        hit = self._event.is_set()
        self._event.clear()
        return hit


class Watches:
    """The watches of one store or subscription, by :func:`end_key`; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, set[Watch]] = {}

    def add(self, key: str, watch: Watch) -> bool:
        """Register ``watch``; ``True`` if it is the first one of ``key``."""
        with self._lock:
            watches = self._by_key.setdefault(key, set())
            watches.add(watch)
            return len(watches) == 1

    def discard(self, key: str, watch: Watch) -> bool:
        """Unregister ``watch``; ``True`` if ``key`` has none left."""
        with self._lock:
            watches = self._by_key.get(key)
            if watches is None:
                return False
            watches.discard(watch)
            if watches:
                return False
            del self._by_key[key]
            return True

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._by_key)

    def notify(self, keys: Iterable[str]) -> None:
        """These tasks may have ended: wake their watches."""
        with self._lock:
            targets = [w for k in keys for w in self._by_key.get(k, ())]
        for watch in targets:
            watch.notify()

    def notify_all(self) -> None:
        """Notifications may have been lost (a reconnect): wake every watch to look again."""
        with self._lock:
            targets = [w for ws in self._by_key.values() for w in ws]
        for watch in targets:
            watch.notify()

    @contextlib.asynccontextmanager
    async def watching(self, key: str) -> AsyncIterator[Watch]:
        """A :class:`Watch` registered under ``key`` for the block."""
        watch = Watch()
        self.add(key, watch)
        try:
            yield watch
        finally:
            self.discard(key, watch)


_stores: dict[str, Watches] = {}


def watches(key: str) -> Watches:
    """The watches of every broker of this process on the store ``key``."""
    with _lock:
        return _stores.setdefault(key, Watches())


def ended(key: str, tasks: Iterable[tuple[str, str]]) -> None:
    """Tell the watches of this process on the store ``key`` that ``(queue, id)`` ended."""
    found = _stores.get(key)
    if found is not None:
        found.notify(end_key(q, i) for q, i in tasks)
