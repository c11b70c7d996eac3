"""In-process wake-ups: an enqueue wakes every idle waiter on the same database file at once.

Several broker instances of one process (an app's client and its worker, or several workers)
may point at the same file; they share this registry, keyed by the file's absolute path.
Notifications come from the broker's database thread after a commit, so waking goes through
``loop.call_soon_threadsafe``. Other processes are noticed by polling ``PRAGMA data_version``.
"""

from __future__ import annotations

import asyncio
import threading
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


_lock = threading.Lock()
_waiters: dict[str, set[Waiter]] = {}


def add(key: str, waiter: Waiter) -> None:
    """Register a waiter before reading any state, so no notification slips between."""
    with _lock:
        _waiters.setdefault(key, set()).add(waiter)


def remove(key: str, waiter: Waiter) -> None:
    """Forget a waiter (always, in a ``finally``)."""
    with _lock:
        group = _waiters.get(key)
        if group is not None:
            group.discard(waiter)
            if not group:
                del _waiters[key]


def notify(key: str, queues: Iterable[str] | None = None) -> None:
    """Wake the waiters on ``key`` serving any of ``queues`` (all of them when ``None``)."""
    wanted = None if queues is None else frozenset(queues)
    with _lock:
        targets = [
            w for w in _waiters.get(key, ()) if wanted is None or not wanted.isdisjoint(w.queues)
        ]
    for waiter in targets:
        waiter.wake()
