"""Resilience primitives for outbound calls: circuit breaker, bulkhead, short in-memory retry.

Each partner system gets its own breaker and bulkhead (per-system isolation): an insurance
outage must not use up the slots or trip the breaker of the warehouses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .config import IN_MEMORY_WAIT_LIMIT

log = logging.getLogger("insurance.resilience")

T = TypeVar("T")


class SystemUnavailableError(Exception):
    """An external system could not be used; ``systems`` names which."""

    def __init__(self, systems: str | list[str], reason: str) -> None:
        self.systems = [systems] if isinstance(systems, str) else sorted(systems)
        self.reason = reason
        super().__init__(f"{', '.join(self.systems)} unavailable: {reason}")


class CircuitOpenError(SystemUnavailableError):
    """The breaker of this system is open: fail fast without calling it."""


class CircuitBreaker:
    """Closed -> open after ``failures`` consecutive failures; after ``reset`` seconds one
    probe call is let through (half-open): success closes, failure opens again.

    While a partner is down, polling tasks fail fast here instead of each waiting for a
    timeout, and the partner gets no load until it can answer again."""

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(
        self,
        name: str,
        *,
        failures: int = 5,
        reset: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.failures = failures
        self.reset = reset
        self._clock = clock
        self._state = self.CLOSED
        self._count = 0
        self._opened_at = 0.0
        self._probing = False
        #: How often the breaker opened (exposed on /health).
        self.opened = 0

    @property
    def state(self) -> str:
        if self._state == self.OPEN and self._clock() - self._opened_at >= self.reset:
            return self.HALF_OPEN
        return self._state

    def before_call(self) -> None:
        """Raise :class:`CircuitOpenError` unless a call may go out now."""
        state = self.state
        if state == self.CLOSED:
            return
        if state == self.HALF_OPEN and not self._probing:
            self._probing = True  # exactly one probe at a time
            self._state = self.HALF_OPEN
            return
        raise CircuitOpenError(self.name, "circuit open")

    def success(self) -> None:
        if self._state != self.CLOSED:
            log.info("circuit %s closed", self.name)
        self._state, self._count, self._probing = self.CLOSED, 0, False

    def failure(self) -> None:
        self._count += 1
        if self._state == self.HALF_OPEN or self._count >= self.failures:
            if self._state != self.OPEN:
                self.opened += 1
                log.warning(
                    "circuit %s open for %.1fs after %d failure(s)",
                    self.name,
                    self.reset,
                    self._count,
                )
            self._state, self._opened_at, self._probing = self.OPEN, self._clock(), False

    def release_probe(self) -> None:
        """A probe ended without a verdict (e.g. cancelled): let the next one through."""
        self._probing = False


class Bulkhead:
    """At most ``limit`` concurrent calls to one system (a semaphore); waiting for a slot
    counts against the caller's per-call deadline."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self._sem = asyncio.Semaphore(limit)
        self.in_use = 0

    async def __aenter__(self) -> Bulkhead:
        await self._sem.acquire()
        self.in_use += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.in_use -= 1
        self._sem.release()


async def retry_briefly(
    call: Callable[[], Awaitable[T]],
    *,
    budget: float,
    first_delay: float = 0.1,
) -> T:
    """Retry ``call`` on :class:`SystemUnavailableError` while the *total* in-process wait
    stays within ``budget`` (below 2 s; anything longer is the task queue's
    backoff). An open circuit is never retried here."""
    if budget >= IN_MEMORY_WAIT_LIMIT:
        raise ValueError("in-memory retry must wait less than 2 s in total")
    waited, delay = 0.0, first_delay
    while True:
        try:
            return await call()
        except CircuitOpenError:
            raise
        except SystemUnavailableError:
            if waited + delay > budget:
                raise
            await asyncio.sleep(delay)
            waited += delay
            delay *= 2
