"""The sync face (E10): a private event loop on a daemon thread (the app keeps one broker per
loop, so this loop gets its own connections).

A thin wrapper over the async core, so sync and async calls share one implementation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

R = TypeVar("R")


class SyncRunner:
    """Runs coroutines for sync callers on one background loop, thread-safely."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="durq-sync", daemon=True
        )
        self._thread.start()

    def run(self, make: Callable[[], Awaitable[R]]) -> R:
        """Run ``make()`` on the background loop and wait for its result."""

        async def call() -> R:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        return future.result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
