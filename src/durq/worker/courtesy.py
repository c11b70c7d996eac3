"""A worker that shares its event loop with a web server gives way to the requests.

Inside a web process (``durq_lifespan(app, worker=...)``) background work and requests run
on one loop. A burst of requests makes the loop late; each task the worker starts then adds
to the wait of every request. :class:`LoopCourtesy` measures how late the loop wakes a short
sleep (the loop's lag) and how much of the time the loop's own thread spends on the CPU, and
holds the worker's claims while either says the loop is busy: tasks already running go on, new
ones wait until the loop is on time again. Handlers stay at least once: a held claim only delays work, and no more than
``max_pause`` at a time, so a server that is never idle still runs its tasks.

The share is the loop thread's, not the process's: one loop runs on one core at most, so the
process's share, compared with every core, never showed a saturated loop on two cores. On Linux
it counts the time the thread waited for a core as well as the time it ran (the scheduler's
``schedstat``): on a machine busy with other work a saturated loop gets only part of a core,
and its requests wait all the same.
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
#: The loop is busy while its thread ran (or waited for a core) this share of the wall time,
#: averaged
#: over about ``BUSY_WINDOW`` seconds (short: a burst of requests is seen within 0.1 s).
BUSY_SATURATED = 0.8
BUSY_WINDOW = 0.1


class _BusyClock:
    """Seconds the calling thread ran or waited to run (Linux's per-thread ``schedstat``:
    time on a core plus time in the run queue), else its CPU time. Made on the loop's thread,
    and read there only."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self()
        except (OSError, ValueError, IndexError):
            self.close()

    def __call__(self) -> float:
        if self._fd is None:
            return time.thread_time()
        ran, waited = os.pread(self._fd, 128, 0).split()[:2]
        return (int(ran) + int(waited)) / 1e9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
        #: The share of the time the loop's thread ran or waited for a core (a moving average, 0 to 1).
        self.busy_share = 0.0
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
        busy = _BusyClock()  # this coroutine runs on the loop's thread
        try:
            busy_at = busy()
            while True:
                before = loop.time()
                await asyncio.sleep(SAMPLE_INTERVAL)
                now = loop.time()
                busy_now = busy()
                elapsed = max(now - before, 1e-6)
                self.last_lag = max(0.0, elapsed - SAMPLE_INTERVAL)
                share = min(1.0, (busy_now - busy_at) / elapsed)
                busy_at = busy_now
                self.busy_share += (share - self.busy_share) * min(1.0, elapsed / BUSY_WINDOW)
                self._sample(self.last_lag > self.lag or self.busy_share >= BUSY_SATURATED)
        finally:
            busy.close()

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


__all__ = ["LoopCourtesy"]
