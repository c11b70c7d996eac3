"""Time, injected. Nothing in durq reads the wall clock directly, so tests can move time."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


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

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, when: float) -> None:
        self._now = when


def to_datetime(ts: float | None) -> datetime | None:
    """Epoch seconds to an aware UTC datetime."""
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


SYSTEM_CLOCK = SystemClock()
