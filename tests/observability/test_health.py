"""O4: the health probe pings the broker at most once per TTL and answers from the cache."""

from __future__ import annotations

import asyncio

import durq
from durq.observability.health import HealthProbe


async def test_cached_within_ttl(app: durq.App) -> None:
    now = [0.0]
    probe = HealthProbe(app, ttl=5, monotonic=lambda: now[0])
    first = await probe.check()
    assert first.ok and first.error is None
    now[0] = 4.9
    assert await probe.check() is first
    assert probe.pings == 1
    now[0] = 5.1
    again = await probe.check()
    assert again.ok and again is not first and probe.pings == 2


async def test_concurrent_checks_share_one_ping(app: durq.App) -> None:
    probe = HealthProbe(app, ttl=5)
    results = await asyncio.gather(*(probe.check() for _ in range(20)))
    assert all(r.ok for r in results) and probe.pings == 1


async def test_unreachable_broker_is_not_ready() -> None:
    app = durq.App("sqlite:////nonexistent/dir/durq.sqlite3")
    probe = HealthProbe(app, ttl=5)
    health = await probe.check()
    assert not health.ok and "SQLite" in (health.error or "")
    assert probe.last is health


async def test_hung_broker_times_out(app: durq.App) -> None:
    async def hang() -> None:
        await asyncio.sleep(10)

    app.ping = hang  # type: ignore[method-assign]
    probe = HealthProbe(app, ttl=5, timeout=0.05)
    health = await probe.check()
    assert not health.ok and "timed out" in (health.error or "")
