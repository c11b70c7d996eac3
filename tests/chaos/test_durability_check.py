"""The worker's start-up durability check (docs/guarantees.md): a Redis without AOF or with
an evicting ``maxmemory-policy`` gets exactly one WARNING line; a durable one gets none."""

from __future__ import annotations

import logging

import pytest

import durq


async def start_and_stop(url: str) -> None:
    app = durq.App(url)
    try:
        broker = app.new_broker()
        await broker.migrate()
        await broker.close()
        async with app.worker(queues=["default"], concurrency=1):
            pass
    finally:
        await app.close()


def durability_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "may lose acknowledged tasks" in r.getMessage()
    ]


async def test_redis_without_aof_and_with_eviction_warns_once(throwaway_redis, caplog) -> None:
    server = throwaway_redis("--appendonly", "no", "--maxmemory-policy", "allkeys-lru")
    with caplog.at_level(logging.WARNING, logger="durq.worker"):
        await start_and_stop(f"{server.url}?prefix=dur")
    (line,) = durability_lines(caplog)
    message = line.getMessage()
    assert "maxmemory-policy" in message and "allkeys-lru" in message
    assert "appendonly" in message


async def test_redis_with_fsync_no_warns(throwaway_redis, caplog) -> None:
    server = throwaway_redis("--appendonly", "yes", "--appendfsync", "no")
    with caplog.at_level(logging.WARNING, logger="durq.worker"):
        await start_and_stop(f"{server.url}?prefix=dur")
    (line,) = durability_lines(caplog)
    assert "appendfsync" in line.getMessage()


async def test_durable_redis_does_not_warn(throwaway_redis, caplog) -> None:
    server = throwaway_redis(
        "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction"
    )
    with caplog.at_level(logging.WARNING, logger="durq.worker"):
        await start_and_stop(f"{server.url}?prefix=dur")
    assert durability_lines(caplog) == []


async def test_sqlite_does_not_warn(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="durq.worker"):
        await start_and_stop(f"sqlite:///{tmp_path / 'd.sqlite3'}")
    assert durability_lines(caplog) == []
