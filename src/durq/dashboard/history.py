"""A small in-memory ring of counter samples, for the throughput and failure chart.

The dashboard process reads every queue's ``processed_total`` and ``failed_total`` every
``interval`` seconds; the chart shows the differences between consecutive samples. Nothing is
stored in the broker, so the chart starts empty when the dashboard starts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durq.errors import DurqError

if TYPE_CHECKING:
    from durq.app import App

log = logging.getLogger("durq.dashboard")


@dataclass(frozen=True, slots=True)
class Sample:
    """Counter totals per queue at one moment: ``{queue: (processed, failed)}``."""

    at: float
    totals: dict[str, tuple[int, int]]


class History:
    """Samples of the last ``window`` seconds, one every ``interval`` seconds."""

    def __init__(self, app: App, *, interval: float = 10.0, window: float = 3600.0) -> None:
        self.app = app
        self.interval = interval
        self.window = window
        self.samples: deque[Sample] = deque(maxlen=int(window // interval) + 2)
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> None:
        """Take one sample now (also called by tests)."""
        queues = await self.app.inspector.list_queues()
        totals = {q.name: (q.processed_total, q.failed_total) for q in queues}
        self.samples.append(Sample(self.app.clock.now(), totals))

    def ensure_running(self) -> None:
        """Start the sampling loop on the running event loop, once."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except DurqError as exc:  # a broker outage leaves a gap in the chart, no more
                log.debug("history sample failed: %s", exc)
            await asyncio.sleep(self.interval)

    def series(self, queue: str | None = None) -> dict[str, Any]:
        """Points ``{t, processed, failed}`` (per-minute rates) between consecutive samples."""
        points: list[dict[str, float]] = []
        previous: Sample | None = None
        for current in self.samples:
            if previous is not None and current.at > previous.at:
                span = current.at - previous.at
                done, failed = _delta(previous, current, queue)
                points.append(
                    {
                        "t": current.at,
                        "processed": round(done * 60 / span, 3),
                        "failed": round(failed * 60 / span, 3),
                    }
                )
            previous = current
        return {
            "queue": queue,
            "interval": self.interval,
            "window": self.window,
            "unit": "tasks per minute",
            "points": points,
        }


def _delta(a: Sample, b: Sample, queue: str | None) -> tuple[int, int]:
    names = [queue] if queue is not None else list(b.totals)
    done = failed = 0
    for name in names:
        p1, f1 = b.totals.get(name, (0, 0))
        p0, f0 = a.totals.get(name, (p1, f1))  # a new queue starts from its first sample
        # Counters only grow; a negative step means the storage was reset.
        done += max(0, p1 - p0)
        failed += max(0, f1 - f0)
    return done, failed
