"""A worker that shares its event loop with a web server gives way to the requests.

Inside a web process (``durq_lifespan(app, worker=...)``) background work and requests run
on one loop. A burst of requests makes the loop late; each task the worker starts then adds
to the wait of every request. :class:`LoopCourtesy` measures how late the loop wakes a short
sleep (the loop's lag) and how much CPU the process uses, and holds the worker's claims while
either says the process is busy: tasks already running go on, new ones wait until the loop is
on time again. Handlers stay at least once: a held claim only delays work, and no more than
``max_pause`` at a time, so a server that is never idle still runs its tasks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

log = logging.getLogger("durq.worker")

#: How often the loop's lag is sampled: a sleep this long, and how late it wakes.
SAMPLE_INTERVAL = 0.025
#: Consecutive on-time samples before claims resume (so one quiet moment in a burst does not
#: let a batch of tasks in).
CALM_SAMPLES = 3
#: The process's CPU is saturated above this share of the cores it may use, over one window.
CPU_SATURATED = 0.95
CPU_WINDOW = 0.5


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class LoopCourtesy:
    """Holds a worker's claims while its event loop is late or its process's CPU saturated.

    ``lag`` is in seconds: the loop counts as late when a sleep of ``SAMPLE_INTERVAL`` wakes
    more than ``lag`` after its time. ``max_pause`` bounds one hold."""

    def __init__(self, lag: float = 0.010, *, max_pause: float = 2.0) -> None:
        if not lag > 0:
            raise ValueError("lag must be > 0 seconds")
        if not max_pause > 0:
            raise ValueError("max_pause must be > 0 seconds")
        self.lag = lag
        self.max_pause = max_pause
        #: The last lag measured, in seconds.
        self.last_lag = 0.0
        #: Seconds in all that claims were held, and how many holds there were.
        self.held_seconds = 0.0
        self.holds = 0
        self._on_time = asyncio.Event()
        self._on_time.set()
        self._calm = CALM_SAMPLES
        self._cores = usable_cores()
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        """Whether claims are held now."""
        return not self._on_time.is_set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="durq-loop-courtesy")

    async def stop(self) -> None:
        self._on_time.set()  # nothing waits on a stopped watch
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def wait(self, stop: asyncio.Event) -> None:
        """Return once the process is not busy, after ``max_pause``, or once ``stop`` is set."""
        if self._on_time.is_set():
            return
        started = time.monotonic()
        self.holds += 1
        waits = [asyncio.ensure_future(e.wait()) for e in (self._on_time, stop)]
        try:
            await asyncio.wait(waits, timeout=self.max_pause, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        self.held_seconds += time.monotonic() - started

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        cpu_at, wall_at = time.process_time(), loop.time()
        saturated = False
        while True:
            before = loop.time()
            await asyncio.sleep(SAMPLE_INTERVAL)
            now = loop.time()
            self.last_lag = max(0.0, now - before - SAMPLE_INTERVAL)
            if now - wall_at >= CPU_WINDOW:
                cpu = time.process_time()
                saturated = (cpu - cpu_at) / (now - wall_at) >= CPU_SATURATED * self._cores
                cpu_at, wall_at = cpu, now
            self._sample(self.last_lag > self.lag or saturated)

    def _sample(self, late: bool) -> None:
        if late:
            self._calm = 0
            if self._on_time.is_set():
                log.debug("the loop is %.1f ms late: holding claims", self.last_lag * 1000)
                self._on_time.clear()
            return
        self._calm += 1
        if self._calm >= CALM_SAMPLES and not self._on_time.is_set():
            self._on_time.set()


__all__ = ["LoopCourtesy", "usable_cores"]
