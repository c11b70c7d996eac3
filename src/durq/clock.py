"""Time, injected. Nothing in durq reads the wall clock directly, so tests can move time."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Protocol

from durq import durations


class Clock(Protocol):
    """Seconds since the epoch, as a float; and a clock that only moves forward."""

    def now(self) -> float: ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps (the wall clock may): the machine's
        ``CLOCK_MONOTONIC``, shared by every process of one boot."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        # How far the wall clock was stepped (step()) apart from the monotonic clock.
        self._stepped = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        """Moves with :meth:`advance` and :meth:`set`, not with :meth:`step`."""
        return self._now - self._stepped

    def step(self, by: float) -> None:
        """Step the wall clock only, as NTP or an operator does; the monotonic clock runs on."""
        self._now += float(by)
        self._stepped += float(by)

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
    """The broker server's clock as this process estimates it: the server's time at the last
    measurement plus the time elapsed since on this host's monotonic clock.

    The brokers read the server's clock inside their statements and scripts (PostgreSQL
    ``statement_timestamp()``, Redis ``TIME``); this estimate serves what the client works
    out itself (the day of a counter, the times of a returned TaskInfo). Being monotonic, it
    does not follow when this host's wall clock steps. Measured at connect, then now and
    then; ``offset`` is the server's clock minus this host's wall clock at that moment."""

    def __init__(self, base: Clock | None = None, resync_every: float = 60.0) -> None:
        self._base = base or SYSTEM_CLOCK
        self.offset = 0.0
        self.resync_every = resync_every
        self._synced_at: float | None = None
        self._server_at = 0.0

    def now(self) -> float:
        if self._synced_at is None:
            return self._base.now()
        return self._server_at + (self._base.monotonic() - self._synced_at)

    def monotonic(self) -> float:
        return self._base.monotonic()

    @property
    def due(self) -> bool:
        """True when the offset has never been measured or is older than ``resync_every``."""
        return (
            self._synced_at is None or self._base.monotonic() - self._synced_at > self.resync_every
        )

    async def sync(self, read_server_time: Callable[[], Awaitable[float]]) -> None:
        """Measure: the server's time against the middle of the round trip."""
        before, mono_before = self._base.now(), self._base.monotonic()
        server = await read_server_time()
        after, mono_after = self._base.now(), self._base.monotonic()
        self.offset = server - (before + after) / 2
        self._server_at = server
        self._synced_at = (mono_before + mono_after) / 2


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
