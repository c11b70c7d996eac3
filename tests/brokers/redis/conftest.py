"""Fixtures of the Redis-only tests: an isolated prefix on the shared server, and throw-away
redis-server processes (own port, own temp dir) for tests that restart, flush or lock a server.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from durq.brokers.redis import RedisBroker
from durq.clock import FakeClock
from servers import PrivateRedis, broker_url_for, drop_isolated


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A fresh ``?prefix=`` on the shared Redis, deleted afterwards."""
    url = broker_url_for("redis", tmp_path)
    yield url
    drop_isolated("redis", url)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def rbroker(redis_url: str, clock: FakeClock) -> AsyncIterator[RedisBroker]:
    broker = RedisBroker.from_url(redis_url, clock=clock)
    await broker.migrate()
    yield broker
    await broker.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., PrivateRedis]]:
    """Factory: ``private_redis("--requirepass", "s3cret", port=6390)`` -> started server."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    started: list[PrivateRedis] = []

    def start(*args: str, port: int | None = None) -> PrivateRedis:
        server = PrivateRedis(tmp_path / f"redis-{len(started)}", *args, port=port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()
