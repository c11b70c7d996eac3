"""What tasks held by a limit cost the other work of their queue, counted instead of timed, on
every broker: the worker's instructions per task (callgrind) and the server's work per task.

``limits.py`` times the shipped worker, and on a shared 2-core machine its CPU per task moves
by ±15 % from run to run, more than the 5 % in question. Counts do not move with the load:

* **worker**: a worker (``app.worker()``, one slot for them, a no-op handler, ``retention=0``) drains
  N tasks of its queue under ``valgrind --tool=callgrind``, once with N1 and once with N2;
  the difference over N2 - N1 is the figure per task (start-up, imports and the first claim,
  which holds the limited tasks once, cancel out). Every thread is counted.
* **server**, Redis: a private ``redis-server`` runs under callgrind while a plain worker
  drains N1, then N2 tasks (a new server each time), the same difference.
* PostgreSQL's server side is not counted here: ``pg_stat_database``'s counters, tried for
  it, are flushed by each backend at its own times and swung below zero between runs. The
  claim's statements with and without held tasks are compared in docs/benchmarks.md.
* SQLite runs inside the worker: its work is in the worker's figure.

Scenarios, each against its own fresh storage: ``plain`` (the N tasks alone), ``rate_held``
(999 tasks of one key limited to one start an hour queued first: one runs, 998 stay held the
whole drain, and no slot is taken) and ``key_held`` (999 tasks of a key of concurrency 1
whose running task sleeps through the drain: one slot taken, 998 held), beside
``beside_busy`` (one unlimited task that sleeps through the drain: the same slot taken, no
limit), so that only the limits differ.

    .venv/bin/python benchmarks/held_work.py [--brokers memory,sqlite,postgresql,redis]
        [--sizes 200,600] [--held 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from instructions import collected, private_redis

HERE = Path(__file__).resolve()
SCENARIOS = ("plain", "rate_held", "beside_busy", "key_held")
LONG = 3600.0  # seconds the busy or key-holding task sleeps: longer than any drain


def workload(url: str, scenario: str, tasks: int, held: int) -> None:
    """The measured program: the scenario's other tasks, then a worker draining ``tasks``."""
    import durq
    from durq.options import EnqueueRequest

    app = durq.App(url)

    @app.task("noop", retention=0)
    async def noop(payload: dict[str, int]) -> None:
        """Does nothing."""

    limit = durq.Limit("hourly", rate="1/h")
    if scenario == "key_held":
        limit = durq.Limit("one", concurrency=1)

    @app.task("held", limit=limit, retention=0)
    async def held_task(payload: dict[str, int]) -> None:
        if scenario == "key_held":
            await asyncio.sleep(LONG)

    @app.task("busy", retention=0)
    async def busy(payload: dict[str, int]) -> None:
        await asyncio.sleep(LONG)

    class Done(durq.WorkerHooks):
        def __init__(self) -> None:
            self.left = 0
            self.all_done = asyncio.Event()

        def task_finished(self, task: Any, outcome: str, duration: float) -> None:
            if task.type == "noop":
                self.left -= 1
                if self.left == 0:
                    self.all_done.set()

    done = Done()

    async def bulk(first: int, count: int, task_type: str = "noop") -> None:
        for start in range(first, first + count, 500):
            stop = min(first + count, start + 500)
            await app.enqueue_many(
                [EnqueueRequest(task_type, {"i": i}) for i in range(start, stop)]
            )

    async def run() -> None:
        if scenario in ("rate_held", "key_held"):
            await bulk(0, held, "held")
        elif scenario == "beside_busy":
            await app.enqueue("busy", {})
        # One slot for the drained tasks (two where one is taken): each claim then takes one
        # task, and the count per task does not depend on how a run's timing batched them.
        slots = 2 if scenario in ("beside_busy", "key_held") else 1
        worker = app.worker(concurrency=slots, scheduler=False, hooks=[done], shutdown_timeout=0)
        await worker.start()
        # Warm-up: the first claims (which hold the limited tasks, once) and every path.
        done.left = 3
        await bulk(-3, 3)
        await done.all_done.wait()
        if url.startswith("postgresql"):
            analyze(url)
        done.all_done.clear()
        done.left = tasks
        await bulk(0, tasks)
        await done.all_done.wait()
        await worker.stop()
        await app.close()

    asyncio.run(run())


def analyze(url: str) -> None:
    """Table statistics now, as a database that has run a while has them (the plans of a
    table without any are the planner's guesses, different for 600 rows and for 1,600)."""
    from urllib.parse import parse_qs, urlsplit

    import psycopg

    parts = urlsplit(url)
    schema = parse_qs(parts.query).get("schema", ["durq"])[0]
    with psycopg.connect(parts._replace(query="").geturl(), autocommit=True) as conn:
        for table in ("tasks", "limits"):
            conn.execute(f'ANALYZE "{schema}"."{table}"')


def _workload_cmd(url: str, scenario: str, tasks: int, held: int) -> list[str]:
    return [sys.executable, str(HERE), "workload", url, scenario, str(tasks), str(held)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": "0"}  # the same set and dict orders every run


def worker_count(url: str, scenario: str, tasks: int, held: int) -> int:
    """The worker's instructions for one drain."""
    with tempfile.TemporaryDirectory(prefix="durq-held-") as tmp:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out"]
        cmd += _workload_cmd(url, scenario, tasks, held)
        done = subprocess.run(cmd, capture_output=True, text=True, env=_env())
        if done.returncode != 0:
            raise RuntimeError(f"{scenario} on {url} failed: {done.stderr[-2000:]}")
        return collected(done.stderr)


def redis_server_count(scenario: str, tasks: int, held: int) -> int:
    """A private Redis server's instructions while a plain worker drains ``tasks``."""
    with tempfile.TemporaryDirectory(prefix="durq-held-") as tmp:
        with private_redis(tmp, counted=True) as (url, log):
            subprocess.run(
                _workload_cmd(url, scenario, tasks, held), check=True, capture_output=True
            )
        return collected(log.read_text())


def isolated(base: str) -> tuple[str, Any]:
    """A fresh URL on ``base``'s broker and the object that removes it."""
    from durq.bench.isolation import Isolated

    if base.startswith("memory"):
        return base, None
    where = Isolated.create(None if base.startswith("sqlite") else base)
    asyncio.run(where.prepare())
    return where.url, where


def per_task(low: float, high: float, n1: int, n2: int) -> float:
    return (high - low) / (n2 - n1)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        workload(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="memory,sqlite,postgresql,redis")
    parser.add_argument("--sizes", default="200,600", help="N1,N2 tasks drained")
    parser.add_argument("--held", type=int, default=1000, help="limited tasks queued first")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()
    n1, n2 = (int(n) for n in args.sizes.split(","))
    scenarios = args.scenarios.split(",")
    urls = {
        "memory": "memory://",
        "sqlite": "sqlite:///",
        "postgresql": args.postgres_url,
        "redis": args.redis_url,
    }
    rows: list[tuple[str, str, dict[str, float]]] = []
    for broker in args.brokers.split(","):
        for scenario in scenarios:
            figures: dict[str, float] = {}
            counts = []
            for n in (n1, n2):
                url, where = isolated(urls[broker])
                try:
                    counts.append(worker_count(url, scenario, n, args.held))
                finally:
                    if where is not None:
                        asyncio.run(where.cleanup())
            figures["worker instructions"] = per_task(*counts, n1, n2)
            if broker == "redis":
                low, high = (redis_server_count(scenario, n, args.held) for n in (n1, n2))
                figures["server instructions"] = per_task(low, high, n1, n2)
            rows.append((broker, scenario, figures))
            shown = ", ".join(f"{k} {v:,.1f}" for k, v in figures.items())
            print(f"{broker} {scenario}: {shown}", file=sys.stderr)
    print(f"per task drained ({n1} and {n2} tasks; {args.held - 1} limited tasks queued first)\n")
    print("| broker | figure | " + " | ".join(scenarios) + " | vs plain | vs beside busy |")
    print("|---|---|" + "---:|" * (len(scenarios) + 2))
    for broker in args.brokers.split(","):
        mine = {s: f for b, s, f in rows if b == broker}
        for figure in next(iter(mine.values())):
            values = [mine[s][figure] for s in scenarios]
            cells = [f"{v:,.1f}" for v in values]
            vs = []
            for held_kind, base in (("rate_held", "plain"), ("key_held", "beside_busy")):
                if held_kind in mine and base in mine and mine[base][figure]:
                    change = mine[held_kind][figure] / mine[base][figure] - 1
                    vs.append(f"{change:+.1%}")
                else:
                    vs.append("—")
            print(f"| {broker} | {figure} | " + " | ".join(cells + vs) + " |")


if __name__ == "__main__":
    main()
