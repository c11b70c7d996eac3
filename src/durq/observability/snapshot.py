"""A value read at most once per ``ttl`` seconds, however many callers ask: the queue
figures that ``/metrics`` scrapes and autoscalers poll, so polling never loads the broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from durq.errors import DurqError

T = TypeVar("T")


class Snapshot(Generic[T]):
    """``await get()``: the last value of ``read()``, read again once older than ``ttl``.

    A failed read (a :class:`~durq.errors.DurqError`) is kept as long as a value (raised again to each caller until ``ttl``
    passes), so a broker that is down is not asked again by every poll. Concurrent callers
    of a stale snapshot share one read."""

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        *,
        ttl: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read = read
        self.ttl = ttl
        self._monotonic = monotonic
        self._read_at: float | None = None
        self._value: T | None = None
        self._error: DurqError | None = None
        self._lock: asyncio.Lock | None = None  # made on first use, in the caller's loop

    @property
    def age(self) -> float | None:
        """Seconds since the last read, ``None`` before the first."""
        return None if self._read_at is None else self._monotonic() - self._read_at

    @property
    def last(self) -> T | None:
        """The last value read, whatever its age (``None`` before the first)."""
        return self._value

    def _fresh(self) -> bool:
        age = self.age
        return age is not None and age < self.ttl

    async def get(self) -> T:
        if not self._fresh():
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if not self._fresh():
                    try:
                        self._value, self._error = await self.read(), None
                    except DurqError as exc:
                        self._error = exc
                    self._read_at = self._monotonic()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set with _read_at, no error


__all__ = ["Snapshot"]
