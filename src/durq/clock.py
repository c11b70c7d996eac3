"""Time, injected. Nothing in durq reads the wall clock directly, so tests can move time."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Protocol

from durq import durations


class Clock(Protocol):
    """Seconds since the epoch, as a float."""

    def now(self) -> float: ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, by: float | str | timedelta) -> None:
        """Move forward by seconds, a ``timedelta`` or a duration such as ``"10m"``."""
        if isinstance(by, timedelta):
            self._now += by.total_seconds()
        elif isinstance(by, str):
            self._now += durations.parse(by)
        else:  # a number, negative too (a clock stepped back)
            self._now += float(by)

    def set(self, when: float | datetime) -> None:
        """Jump to epoch seconds or an aware ``datetime``."""
        self._now = when.timestamp() if isinstance(when, datetime) else float(when)


class ServerClock:
    """The broker server's clock, read as this host's clock plus a measured offset.

    Lease expiries and due times are then compared on one time line however far apart the
    clocks of the machines running workers are (PostgreSQL ``clock_timestamp()``, Redis
    ``TIME``). The offset is measured at connect and refreshed now and then."""

    def __init__(self, base: Clock | None = None, resync_every: float = 60.0) -> None:
        self._base = base or SYSTEM_CLOCK
        self.offset = 0.0
        self.resync_every = resync_every
        self._synced_at: float | None = None

    def now(self) -> float:
        return self._base.now() + self.offset

    @property
    def due(self) -> bool:
        """True when the offset has never been measured or is older than ``resync_every``."""
        return self._synced_at is None or self._base.now() - self._synced_at > self.resync_every

    async def sync(self, read_server_time: Callable[[], Awaitable[float]]) -> None:
        """Measure the offset: the server's time against the middle of the round trip."""
        before = self._base.now()
        server = await read_server_time()
        after = self._base.now()
        self.offset = server - (before + after) / 2
        self._synced_at = after


def server_clock_for(clock: Clock) -> ServerClock | None:
    """A :class:`ServerClock` when ``clock`` is the real wall clock; ``None`` for an injected
    test clock, which must stay in charge of time."""
    return ServerClock(clock) if isinstance(clock, SystemClock) else None


def to_datetime(ts: float | None) -> datetime | None:
    """Epoch seconds to an aware UTC datetime."""
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


SYSTEM_CLOCK = SystemClock()


def utc_day(ts: float) -> date:
    """The UTC day of an epoch time: the key of the inspector's daily counters."""
    return datetime.fromtimestamp(ts, tz=UTC).date()
