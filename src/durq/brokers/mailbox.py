"""In-process wake-ups: an enqueue wakes every idle waiter of this process on the same store.

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
import threading
import weakref
from collections.abc import Iterable


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
