"""Flow control (W13) through the app and a real worker: limits given at ``@app.task`` or
per enqueue, keys filled from the payload, and a worker that never runs more of a key at once
than its limit while other work flows past the held tasks."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

import durq
from conformance.apps import FAST
from durq.errors import ValidationError
from durq.task import LimitSpec


async def test_W13_limits_are_stored_with_the_task(app: durq.App) -> None:

    @app.task(
        "partner:call",
        limit=[durq.Limit("partners", concurrency=10), durq.Limit("p:{partner}", rate="5/s")],
    )
    async def call(payload: dict[str, Any]) -> None: ...

    info = await call.enqueue({"partner": "acme"})
    assert info.limits == (LimitSpec("partners", 10), LimitSpec("p:acme", rate=5, per=1.0))
    got = await app.inspector.get_task_info("default", info.id)
    assert got.limits == info.limits
    # Per enqueue, a limit replaces the type's.
    info = await call.enqueue({"partner": "x"}, limit=durq.Limit("solo", concurrency=1))
    assert info.limits == (LimitSpec("solo", 1),)
    with pytest.raises(ValidationError, match="partner"):
        await call.enqueue({"other": 1})


async def test_W13_worker_never_exceeds_a_key_and_others_flow_past(app: durq.App) -> None:
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    done: list[str] = []

    @app.task("limited:job", limit=durq.Limit("k:{k}", concurrency=2))
    async def limited(payload: dict[str, Any]) -> None:
        key = payload["k"]
        running[key] = running.get(key, 0) + 1
        peak[key] = max(peak.get(key, 0), running[key])
        await asyncio.sleep(0.05)
        running[key] -= 1
        done.append(key)

    @app.task("free:job")
    async def free(payload: dict[str, Any]) -> None:
        done.append("free")

    await app.enqueue_many(
        [limited.request({"k": k}) for k in ("a", "b") for _ in range(10)]
        + [free.request({}) for _ in range(5)]
    )
    start = time.monotonic()
    async with app.worker(concurrency=20, **FAST):
        while len(done) < 25 and time.monotonic() - start < 30:
            await asyncio.sleep(0.02)
    assert len(done) == 25
    assert peak == {"a": 2, "b": 2}
    # The unlimited tasks did not wait behind the held ones.
    assert done.index("free") < done.index("a") + 10
    stats = {s.key: s for s in await app.inspector.list_limits("default")}
    assert {k: (s.running, s.waiting, s.concurrency) for k, s in stats.items()} == {
        "k:a": (0, 0, 2),
        "k:b": (0, 0, 2),
    }


async def test_W24_a_cost_from_the_payload_is_resolved_at_enqueue(app: durq.App) -> None:
    @app.task("report:build", limit=durq.Limit("pages", concurrency=500, cost="{pages}"))
    async def build(payload: dict[str, Any]) -> None: ...

    info = await build.enqueue({"pages": 120})
    assert info.limits == (LimitSpec("pages", 500, cost=120),)
    assert (await app.inspector.get_task_info("default", info.id)).limits == info.limits
    for payload, words in (
        ({}, "payload field 'pages', which is missing"),
        ({"pages": 0}, "integer from 1"),
        ({"pages": "3"}, "integer from 1"),
        ({"pages": 2.5}, "integer from 1"),
        ({"pages": True}, "integer from 1"),
        ({"pages": 501}, "exceeds its concurrency 500: such a task could never start"),
    ):
        with pytest.raises(ValidationError, match=words):
            await build.enqueue(payload)


def test_W24_a_cost_no_task_could_pay_is_refused_when_the_limit_is_made() -> None:
    with pytest.raises(ValidationError, match="exceeds its concurrency 2"):
        durq.Limit("k", concurrency=2, cost=3)
    with pytest.raises(ValidationError, match="exceeds its rate '4/s'"):
        durq.Limit("k", rate="4/s", cost=5)
    with pytest.raises(ValidationError, match="one payload field in braces"):
        durq.Limit("k", concurrency=2, cost="pages")
    with pytest.raises(ValidationError, match="integer from 1"):
        durq.Limit("k", concurrency=2, cost=0)
    assert durq.Limit("k", concurrency=5, rate="10/s", cost=5).cost == 5


async def test_W24_a_worker_never_runs_more_units_than_the_limit(app: durq.App) -> None:
    """Reports of 1 to 4 pages under 5 pages at once: the pages rendering never exceed 5,
    and every report runs."""
    pages_now = peak = 0
    done: list[int] = []

    @app.task("report:render", limit=durq.Limit("pages", concurrency=5, cost="{pages}"))
    async def render(payload: dict[str, Any]) -> None:
        nonlocal pages_now, peak
        pages_now += payload["pages"]
        peak = max(peak, pages_now)
        await asyncio.sleep(0.02)
        pages_now -= payload["pages"]
        done.append(payload["pages"])

    sizes = [4, 1, 3, 2, 4, 4, 1, 1, 2, 3, 4, 1]
    await app.enqueue_many([render.request({"pages": n}) for n in sizes])
    start = time.monotonic()
    async with app.worker(concurrency=10, **FAST):
        while len(done) < len(sizes) and time.monotonic() - start < 30:
            await asyncio.sleep(0.02)
    assert sorted(done) == sorted(sizes)
    assert peak <= 5
    stats = {s.key: s for s in await app.inspector.list_limits("default")}
    assert (stats["pages"].running, stats["pages"].waiting) == (0, 0)


async def test_W25_a_worker_runs_each_account_s_tasks_in_order_across_failures(
    app: durq.App,
) -> None:
    """3 accounts x 20 tasks in a strict sequence each, some failing once or twice before
    they succeed (a short retry delay): per account, the successful runs come in enqueue
    order and no two of its tasks ever run at once, while the accounts run side by side."""
    draws = random.Random(25)
    failures = {(a, n): draws.choice([0, 0, 1, 2]) for a in "abc" for n in range(20)}
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    succeeded: dict[str, list[int]] = {a: [] for a in "abc"}
    attempts: dict[tuple[str, int], int] = {}

    @app.task(
        "account:post",
        limit=durq.Limit("account:{account}", sequence=True),
        max_retry=5,
        retry_delay=lambda retried, exc: 0.05,
    )
    async def post(payload: dict[str, Any]) -> None:
        account, n = payload["account"], payload["n"]
        running[account] = running.get(account, 0) + 1
        peak[account] = max(peak.get(account, 0), running[account])
        try:
            await asyncio.sleep(0.005)
            attempts[account, n] = attempts.get((account, n), 0) + 1
            if attempts[account, n] <= failures[account, n]:
                raise RuntimeError("the ledger is busy")
            succeeded[account].append(n)
        finally:
            running[account] -= 1

    await app.enqueue_many([post.request({"account": a, "n": n}) for n in range(20) for a in "abc"])
    start = time.monotonic()
    async with app.worker(concurrency=10, **FAST):
        while sum(map(len, succeeded.values())) < 60 and time.monotonic() - start < 60:
            await asyncio.sleep(0.02)
    assert succeeded == {a: list(range(20)) for a in "abc"}
    assert peak == {"a": 1, "b": 1, "c": 1}
    assert sum(failures.values()) > 10  # retries did happen, on every account
    assert all(any(failures[a, n] for n in range(20)) for a in "abc")
    stats = {s.key: s for s in await app.inspector.list_limits("default")}
    assert {k: (s.running, s.waiting) for k, s in stats.items()} == {
        f"account:{a}": (0, 0) for a in "abc"
    }
