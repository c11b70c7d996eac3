"""Fixtures of the Redis-only tests: an isolated prefix on the shared server, and throw-away
redis-server processes (own port, own temp dir) for tests that restart, flush or lock a server.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from durq.brokers.redis import RedisBroker
from durq.clock import FakeClock
from servers import broker_url_for, drop_isolated


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateRedis:
    """A redis-server of our own; never the shared one on 6379."""

    port: int
    dir: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--save",
                "",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL: no shutdown save, like a crash or an OOM kill."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., PrivateRedis]]:
    """Factory: ``private_redis("--requirepass", "s3cret", port=6390)`` -> started server."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    started: list[PrivateRedis] = []

    def start(*args: str, port: int | None = None) -> PrivateRedis:
        data = tmp_path / f"redis-{len(started)}"
        data.mkdir()
        server = PrivateRedis(port or free_port(), data, list(args))
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()
