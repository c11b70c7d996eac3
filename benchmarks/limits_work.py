"""What held tasks cost the claims of other work on SQLite, counted instead of timed: the
SQLite virtual-machine instructions per unlimited task, which the machine's other load does
not move (a rate moves by ±15 % between runs of a few seconds on a shared 2-core machine).

In-process (``app.worker``, 10 slots): N no-op tasks queued behind, in turn, nothing; M tasks
held by a rate of one an hour (no slot taken); one long unlimited task (one slot taken); M
tasks of a key limited to one at a time, whose running one sleeps (one slot taken, M - 1
held). Instructions are counted by a progress handler on every connection the broker opens,
between the 200th and the (N - 200)th completion, so the start (where the claim holds the M
tasks back, once) and the end are left out.

    .venv/bin/python benchmarks/limits_work.py [--tasks 3000] [--held 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import tempfile
from typing import Any

import durq
from durq.options import EnqueueRequest

STEP = 10  # the progress handler runs every STEP instructions
_count = [0]
_connect = sqlite3.connect


def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _connect(*args, **kwargs)

    def tick() -> int:
        _count[0] += 1
        return 0

    conn.set_progress_handler(tick, STEP)
    return conn


async def run(kind: str, n: int, held: int) -> float:
    """SQLite instructions per unlimited task with ``kind`` beside them."""
    tmp = tempfile.mkdtemp(prefix="durq-limits-work-")
    app = durq.App(f"sqlite:///{tmp}/bench.sqlite3")
    done, marks, finished = 0, [], asyncio.Event()

    @app.task("free", retention=0)
    async def free(payload: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        if done in (200, n - 200):
            marks.append(_count[0])
        if done == n - 200:
            finished.set()

    limit = durq.Limit("hourly", rate="1/h") if kind == "rate" else durq.Limit("one", concurrency=1)

    @app.task("held", limit=limit)
    async def held_task(payload: dict[str, Any]) -> None:
        if kind == "concurrency":
            await asyncio.sleep(600)

    @app.task("busy")
    async def busy(payload: dict[str, Any]) -> None:
        await asyncio.sleep(600)

    try:
        if kind in ("rate", "concurrency"):
            for first in range(0, held, 1000):
                count = min(1000, held - first)
                await app.enqueue_many([EnqueueRequest("held", {}) for _ in range(count)])
        elif kind == "busy":
            await app.enqueue("busy", {})
        for first in range(0, n, 1000):
            count = min(1000, n - first)
            await app.enqueue_many([EnqueueRequest("free", {}) for _ in range(count)])
        async with app.worker(concurrency=10, shutdown_timeout=0):
            await finished.wait()
    finally:
        await app.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return (marks[1] - marks[0]) * STEP / (n - 400)


async def main(args: argparse.Namespace) -> None:
    sqlite3.connect = _counting_connect  # type: ignore[assignment]
    kinds = ("unlimited", "rate", "busy", "concurrency")
    print("| round | unlimited | held by a rate | beside busy | held by concurrency 1 |")
    print("|---|---:|---:|---:|---:|")
    for r in range(args.rounds):
        figures = [await run(kind, args.tasks, args.held) for kind in kinds]
        print(f"| {r + 1} | " + " | ".join(f"{f:.0f}" for f in figures) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
