"""Flow control figures: what limits cost the work that has none, and how close a key at
its limit comes to ``concurrency / task duration`` (or to its rate).

Each scenario runs a fresh isolated broker (a temporary SQLite file, a new PostgreSQL schema
or Redis key prefix, removed afterwards) and one worker process (this file, ``worker`` mode:
a real :class:`durq.Worker` with ``--concurrency`` slots) started after the tasks are queued:

* ``unlimited``: N no-op tasks without limits; tasks/s from the first start to the N-th
  completion.
* ``unlimited_with_held``: the same N tasks queued *behind* M tasks of one key limited to
  one at a time (each sleeps 1 s), so M - 1 of them wait, held, in the same queue the whole
  run; the figure counts the unlimited tasks only. The two alternate ``--rounds`` times; the
  medians are compared, as throughput and as the worker process's CPU per unlimited task
  (the steadier figure on a shared machine).
* ``at_limit``: K tasks of one key with ``concurrency=C`` that each sleep D s; expected
  ``C / D`` tasks/s.
* ``at_rate``: R no-op tasks of one key with ``rate="X/s"``; starts/s after the first full
  bucket, expected X.

    .venv/bin/python benchmarks/limits.py [--broker URL] [--tasks 5000] [--held 2000]
        [--concurrency 50] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import durq
from durq.bench.isolation import Isolated, redact
from durq.options import EnqueueRequest
from durq.task import TaskInfo
from durq.worker.hooks import WorkerHooks

QUEUE = "limits_bench"
AT_LIMIT = (5, 0.1)  # concurrency, seconds per task
RATE = 50


def build(url: str) -> durq.App:
    app = durq.App(url)

    @app.task("bench:free", queue=QUEUE, max_retry=0)
    async def free(payload: dict[str, Any]) -> None:
        return None

    @app.task("bench:held", queue=QUEUE, max_retry=0, limit=durq.Limit("one", concurrency=1))
    async def held(payload: dict[str, Any]) -> None:
        await asyncio.sleep(1.0)

    @app.task(
        "bench:at_limit",
        queue=QUEUE,
        max_retry=0,
        limit=durq.Limit("busy", concurrency=AT_LIMIT[0]),
    )
    async def at_limit(payload: dict[str, Any]) -> None:
        await asyncio.sleep(AT_LIMIT[1])

    @app.task("bench:rated", queue=QUEUE, max_retry=0, limit=durq.Limit("api", rate=f"{RATE}/s"))
    async def rated(payload: dict[str, Any]) -> None:
        return None

    return app


# -- the worker process ------------------------------------------------------------------------


class Clock(WorkerHooks):
    """First start and N-th completion of the watched type; prints one line when done."""

    def __init__(self, watched: str, expected: int) -> None:
        self.watched, self.expected = watched, expected
        self.first: float | None = None
        self.cpu_first = 0.0
        self.starts: list[float] = []
        self.done = 0

    def task_started(self, task: TaskInfo) -> None:
        if task.type == self.watched:
            now = time.time()
            if self.first is None:
                self.first, self.cpu_first = now, time.process_time()
            self.starts.append(now)

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        if task.type != self.watched:
            return
        self.done += 1
        if self.done == self.expected:
            cpu = time.process_time() - self.cpu_first  # every thread of the worker process
            line = {"first": self.first, "last": time.time(), "starts": self.starts, "cpu": cpu}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()


async def work(url: str, concurrency: int, watched: str, expected: int) -> None:
    app = build(url)
    clock = Clock(watched, expected)
    worker = app.worker(
        queues=[QUEUE], concurrency=concurrency, hooks=[clock], summary_interval=None
    )
    await worker.run()


# -- the parent --------------------------------------------------------------------------------


async def scenario(
    base: str | None, items: list[tuple[str, int]], watched: str, concurrency: int
) -> dict[str, Any]:
    """Queue ``items`` (type, count) in order, run one worker until ``watched`` is done."""
    isolated = Isolated.create(base)
    await isolated.prepare()
    try:
        app = build(isolated.url)
        try:
            for task_type, count in items:
                for start in range(0, count, 1000):
                    n = min(1000, count - start)
                    await app.enqueue_many([EnqueueRequest(task_type, {}) for _ in range(n)])
        finally:
            await app.close()
        expected = dict(items)[watched]
        argv = [sys.executable, __file__, "worker", isolated.url, str(concurrency), watched]
        proc = subprocess.Popen([*argv, str(expected)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
        finally:
            proc.terminate()
            proc.wait(30)
        if not line:
            raise RuntimeError(f"the worker of {watched} exited without finishing")
        result: dict[str, Any] = json.loads(line)
        return result
    finally:
        await isolated.cleanup()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    c = args.concurrency
    free, with_held, cpu_free, cpu_held = [], [], [], []
    for _ in range(args.rounds):
        r = await scenario(args.broker, [("bench:free", args.tasks)], "bench:free", c)
        free.append(args.tasks / (r["last"] - r["first"]))
        cpu_free.append(1e6 * r["cpu"] / args.tasks)
        r = await scenario(
            args.broker,
            [("bench:held", args.held), ("bench:free", args.tasks)],
            "bench:free",
            c,
        )
        with_held.append(args.tasks / (r["last"] - r["first"]))
        cpu_held.append(1e6 * r["cpu"] / args.tasks)
    k = AT_LIMIT[0] * 40
    r = await scenario(args.broker, [("bench:at_limit", k)], "bench:at_limit", c)
    at_limit = k / (r["last"] - r["first"])
    n = RATE * 10
    r = await scenario(args.broker, [("bench:rated", n)], "bench:rated", c)
    starts = r["starts"]
    steady = starts[RATE:]  # after the first full bucket
    at_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    base, held = statistics.median(free), statistics.median(with_held)
    return {
        "broker": redact(args.broker) if args.broker else "sqlite (temporary file)",
        "concurrency": c,
        "unlimited_per_s": {"median": round(base, 1), "runs": [round(x, 1) for x in free]},
        "unlimited_with_held_per_s": {
            "median": round(held, 1),
            "runs": [round(x, 1) for x in with_held],
            "held_tasks": args.held - 1,
        },
        "unlimited_change_pct": round(100 * (held - base) / base, 1),
        # CPU of the worker process per unlimited task (us): steadier than throughput on a
        # loaded machine; on SQLite it includes the database work, elsewhere the client's.
        "worker_cpu_us_per_task": {
            "unlimited": round(statistics.median(cpu_free)),
            "with_held": round(statistics.median(cpu_held)),
        },
        "at_limit": {
            "concurrency": AT_LIMIT[0],
            "task_seconds": AT_LIMIT[1],
            "expected_per_s": AT_LIMIT[0] / AT_LIMIT[1],
            "measured_per_s": round(at_limit, 1),
        },
        "at_rate": {"rate_per_s": RATE, "measured_starts_per_s": round(at_rate, 1)},
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        url, concurrency, watched, expected = sys.argv[2:6]
        asyncio.run(work(url, int(concurrency), watched, int(expected)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=None, help="broker URL (default: temporary SQLite)")
    parser.add_argument("--tasks", type=int, default=5000, help="unlimited tasks per run")
    parser.add_argument("--held", type=int, default=2000, help="limited tasks queued ahead")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    main()
