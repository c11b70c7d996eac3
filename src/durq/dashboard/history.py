"""The throughput and failure chart: the broker's per-minute counters of the last hour.

Workers count every processed and failed task per queue and minute in the broker (see
:meth:`durq.brokers.contract.Admin.minute_counts`); the chart reads them. Every dashboard
instance shows the same history, and a restarted one shows it at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durq.brokers.views import minute_of

if TYPE_CHECKING:
    from durq.appview import AdminView

#: One point per minute.
INTERVAL = 60


class History:
    """Series of the last ``window`` seconds, one point per minute."""

    def __init__(self, app: AdminView, *, window: float = 3600.0) -> None:
        self.app = app
        self.window = window

    async def series(self, queue: str | None = None) -> dict[str, Any]:
        """Points ``{t, processed, failed}``: ``t`` a minute's start (epoch seconds), the
        counts that minute; every minute of the window, zeros included, up to the current
        (partial) one."""
        now = self.app.clock.now()
        counts = await self.app.inspector.minute_counts(queue, now - self.window)
        by_minute = {c.minute: c for c in counts}
        # The broker's clock may run a little ahead of this process's: end at its last minute.
        last = max([minute_of(now), *by_minute])
        first = last - int(self.window // INTERVAL - 1) * INTERVAL
        points = []
        for minute in range(first, last + INTERVAL, INTERVAL):
            found = by_minute.get(minute)
            points.append(
                {
                    "t": minute,
                    "processed": found.processed if found else 0,
                    "failed": found.failed if found else 0,
                }
            )
        return {
            "queue": queue,
            "interval": INTERVAL,
            "window": self.window,
            "unit": "tasks per minute",
            "points": points,
        }
