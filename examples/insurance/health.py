"""Health probe with a TTL cache.

The probe pings the broker (one cheap round trip), never does business work, and caches the
verdict for ``ttl`` seconds so a load balancer polling every second costs one ping per ttl.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import durq


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: str | None
    checked_at: float


class HealthProbe:
    """``await probe.check()``: the cached verdict, refreshed at most once per ``ttl``."""

    def __init__(self, app: durq.App, *, ttl: float, timeout: float = 2.0) -> None:
        self.app = app
        self.ttl = ttl
        self.timeout = timeout
        self._verdict: Verdict | None = None
        self._lock = asyncio.Lock()
        #: How many real pings were made (tests check the cache with it).
        self.pings = 0

    async def check(self) -> tuple[Verdict, bool]:
        """The verdict and whether it came from the cache."""
        verdict = self._verdict
        if verdict is not None and time.monotonic() - verdict.checked_at < self.ttl:
            return verdict, True
        async with self._lock:  # one ping at a time, however many probes arrive
            verdict = self._verdict
            if verdict is not None and time.monotonic() - verdict.checked_at < self.ttl:
                return verdict, True
            self.pings += 1
            try:
                async with asyncio.timeout(self.timeout):
                    await self.app.ping()
                verdict = Verdict(True, None, time.monotonic())
            except TimeoutError:
                verdict = Verdict(False, f"no answer within {self.timeout:g}s", time.monotonic())
            except durq.DurqError as exc:
                verdict = Verdict(False, str(exc), time.monotonic())
            self._verdict = verdict
            return verdict, False
