"""Health probes: answered from a TTL-cached broker ping, never from business work.

``/healthz`` (liveness) says the process and its event loop answer; ``/readyz`` (readiness)
says the broker answered a ping within the last ``ttl`` seconds. Served by the worker's
metrics server (:mod:`durq.observability.metrics`), usually on every interface: the answer
says ready or not, and why only when asked to (the reason may name the broker's host and
user); the reason is logged either way."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durq.errors import DurqError
from durq.observability.snapshot import Snapshot

if TYPE_CHECKING:
    from durq.appview import AdminView

log = logging.getLogger("durq.health")


@dataclass(frozen=True, slots=True)
class Health:
    """The outcome of one broker ping."""

    ok: bool
    #: Why the broker is not ready; ``None`` when ok.
    error: str | None
    #: Monotonic time of the ping.
    checked_at: float
    #: Seconds the ping took.
    latency: float


class HealthProbe:
    """Pings the broker at most once per ``ttl`` seconds; concurrent callers share one ping.

    A ping that takes longer than ``timeout`` counts as a failure, so a hung broker makes
    the probe answer "not ready" promptly instead of hanging the orchestrator's check."""

    def __init__(
        self,
        app: AdminView,
        ttl: float = 5.0,
        *,
        timeout: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.ttl = ttl
        self.timeout = timeout
        self._monotonic = monotonic
        self._snapshot = Snapshot(self._ping, ttl=ttl, monotonic=monotonic)
        #: How many pings were sent (tests check the cache with it).
        self.pings = 0

    @property
    def last(self) -> Health | None:
        """The cached result, whatever its age."""
        return self._snapshot.last

    async def check(self) -> Health:
        """The cached result if younger than ``ttl``, else a new ping."""
        return await self._snapshot.get()

    async def _ping(self) -> Health:
        self.pings += 1
        started = self._monotonic()
        error: str | None = None
        try:
            await asyncio.wait_for(self.app.ping(), self.timeout)
        except TimeoutError:
            error = f"broker ping timed out after {self.timeout:g}s"
        except DurqError as exc:
            error = exc.message
        except OSError as exc:  # a driver error that escaped the broker's wrapping
            error = f"{type(exc).__name__}: {exc}"
        finished = self._monotonic()
        if error is not None:
            log.warning("readiness: the broker ping failed: %s", error)
        return Health(error is None, error, finished, finished - started)


def readiness(health: Health, *, details: bool = False) -> tuple[int, str]:
    """The status and text ``/readyz`` answers for ``health``: ``200 ready`` or
    ``503 not ready``, with the reason only when ``details`` (it may name the broker's
    host and user; probes need only the status)."""
    if health.ok:
        return 200, "ready\n"
    if details:
        return 503, f"not ready: {health.error}\n"
    return 503, "not ready\n"
