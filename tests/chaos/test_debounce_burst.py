"""A burst of edits to one document, debounced (``durq.Debounce``), through a real worker:
enqueues at random intervals over a span of seconds collapse into a handful of runs, at most
one per ``max_wait`` (plus the one that was collecting when the burst ended), each with the
latest payload it could see, and the last edit is never lost.

``make test`` runs a 4 s burst of 400 edits on every broker; ``make chaos`` the 10 s burst of
1,000 edits with wait 1 s and max_wait 3 s."""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

import pytest

import durq


async def debounced_burst(
    url: str, *, edits: int, span: float, wait: float, max_wait: float
) -> None:
    app = durq.App(url)
    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    runs: list[tuple[int, float]] = []
    burst = durq.Debounce("doc_id", wait=wait, max_wait=max_wait)

    @app.task("doc:index", unique=burst, retention=600)
    async def index(payload: dict[str, Any]) -> None:
        runs.append((int(payload["rev"]), time.monotonic()))

    rng = random.Random(7)
    gaps = [rng.expovariate(edits / span) for _ in range(edits)]
    scale = span / sum(gaps)  # the burst lasts ``span`` seconds whatever the draws
    try:
        async with app.worker(concurrency=4, poll_interval=0.05):
            began = time.monotonic()
            due = began
            for rev, gap in enumerate(gaps):
                # On a schedule, so the time an enqueue takes comes out of the next gap.
                due += gap * scale
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await index.enqueue({"doc_id": "d1", "rev": rev})
            took = time.monotonic() - began
            deadline = time.monotonic() + max_wait + 30
            while (not runs or runs[-1][0] != edits - 1) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    finally:
        await app.close()
    revs = [rev for rev, _ in runs]
    print(f"\n[debounce burst] {edits} edits over {took:.1f} s -> {len(runs)} runs: {revs}")
    assert revs and revs[-1] == edits - 1, "the last edit never ran"
    assert revs == sorted(set(revs)), "a run saw an older payload than the run before it"
    assert len(runs) <= math.ceil(took / max_wait) + 1, revs


@pytest.mark.timeout(120)
async def test_debounce_burst_short(broker_url: str) -> None:
    await debounced_burst(broker_url, edits=400, span=4.0, wait=0.5, max_wait=1.5)


@pytest.mark.chaos
@pytest.mark.timeout(300)
async def test_debounce_burst_full(broker_url: str) -> None:
    await debounced_burst(broker_url, edits=1000, span=10.0, wait=1.0, max_wait=3.0)
