"""The fetcher survives an unexpected error from ``claim`` instead of dying silently."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import durq
from durq.brokers.base import ClaimParams, Lease


async def test_fetcher_keeps_claiming_after_an_unexpected_error(tmp_path: Path) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    ran = asyncio.Event()

    @app.task("t:job")
    async def job(payload: dict[str, Any]) -> None:
        ran.set()

    broker = app.new_broker()
    real_claim = broker.claim
    failures = [RuntimeError("driver hiccup")]

    async def flaky_claim(params: ClaimParams) -> list[Lease]:
        if failures:
            raise failures.pop()
        return await real_claim(params)

    broker.claim = flaky_claim  # type: ignore[method-assign]
    app.new_broker = lambda: broker  # type: ignore[method-assign]
    worker = app.worker(poll_interval=0.05)
    await worker.start()
    try:
        await job.enqueue({})
        await asyncio.wait_for(ran.wait(), 10)
    finally:
        await asyncio.wait_for(worker.stop(), 10)
        await app.close()
    assert not failures
