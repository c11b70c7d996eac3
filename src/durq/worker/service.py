"""A background service that runs ``tick`` every ``interval`` seconds until stopped."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

from durq.errors import BrokerUnavailableError

log = logging.getLogger("durq.worker")


class PeriodicService(ABC):
    """Start/stop plus an interval; a failing tick is logged and retried next interval."""

    name = "service"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @abstractmethod
    async def tick(self) -> None:
        """One round of work."""

    def start(self) -> None:
        self._stop.clear()
        self._task = asyncio.create_task(self._run(), name=f"durq-{self.name}")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.tick()
            except BrokerUnavailableError as exc:
                log.warning(
                    "%s: broker unavailable (%s); retrying in %.1fs", self.name, exc, self.interval
                )
            except Exception:
                log.exception("%s failed; retrying in %.1fs", self.name, self.interval)
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval)
            except TimeoutError:
                pass
