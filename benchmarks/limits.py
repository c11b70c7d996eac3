"""Flow control figures: what limits cost the work that has none, and how close a key at
its limit comes to ``concurrency / task duration`` (or to its rate).

Measured the way users run a worker: each scenario queues its tasks on a fresh isolated
broker (a temporary SQLite file, a new PostgreSQL schema or Redis key prefix, removed
afterwards), then starts the shipped ``durq worker limits:app --concurrency C`` command as a
subprocess (INFO logging, the README's default concurrency of 10 unless ``--concurrency``
says otherwise). Every handler appends one line to a per-process file when it ends (its
start, its end and the worker process's CPU time from ``getrusage``); the parent counts the
lines from outside, stops the worker once the watched tasks are done and reads the figures
from the file. The worker's whole-life CPU comes from the child's rusage after it exits.

* ``unlimited``: N no-op tasks without limits; tasks/s from the first start to the N-th end.
* ``unlimited_with_held``: the same N tasks queued *behind* M tasks of one key limited to
  one at a time, each sleeping longer than the run: one of them runs (it keeps one of the
  worker's slots) and M - 1 wait, held, in the same queue the whole run. The figure counts
  the unlimited tasks only.
* ``unlimited_beside_busy``: the same N tasks behind ONE unlimited task that sleeps as long,
  so one slot is taken the same way and only the limit and the held tasks differ: what the
  limits themselves cost, apart from the slot the limited task takes.
* ``unlimited_with_rate_held``: the same N tasks behind M no-op tasks of one key limited to
  one start an hour: the first runs at once and ends, M - 1 wait, held by the empty bucket,
  and no slot is taken: limited tasks present in the queue against none, all else equal.
* The four alternate ``--rounds`` times; the medians are compared, as throughput and as the
  worker's CPU per unlimited task between the first and the N-th (the steadier figure on a
  shared machine), and so is each round's ratio to the unlimited run of the same round.
* ``at_limit``: K tasks of one key with ``concurrency=5`` that each sleep 0.1 s; expected
  ``5 / 0.1 = 50`` tasks/s.
* ``at_rate``: R no-op tasks of one key with ``rate="50/s"``; starts/s after the first full
  bucket, expected 50.

    .venv/bin/python benchmarks/limits.py [--broker URL] [--concurrency 10] [--tasks 3000]
        [--held 1000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shlex
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from peers._common import _children_cpu, _stop, _wait, durq_worker, ended, lines, record

import durq
from durq.bench.isolation import Isolated
from durq.options import EnqueueRequest
from durq.urls import redact

HERE = Path(__file__).resolve().parent
QUEUE = "limits_bench"
AT_LIMIT = (5, 0.1)  # concurrency, seconds per task
RATE = 50
LONG = 600.0  # seconds a held or busy task sleeps: longer than any run


def build(url: str) -> durq.App:
    """The app ``durq worker limits:app`` runs (and the parent enqueues with)."""
    app = durq.App(url)

    @app.task("bench:free", queue=QUEUE, max_retry=0)
    async def free(payload: dict[str, Any]) -> None:
        record("free", time.time())

    @app.task("bench:held", queue=QUEUE, max_retry=0, limit=durq.Limit("one", concurrency=1))
    async def held(payload: dict[str, Any]) -> None:
        await asyncio.sleep(LONG)

    @app.task("bench:rate_held", queue=QUEUE, max_retry=0, limit=durq.Limit("hourly", rate="1/h"))
    async def rate_held(payload: dict[str, Any]) -> None:
        pass

    @app.task("bench:busy", queue=QUEUE, max_retry=0)
    async def busy(payload: dict[str, Any]) -> None:
        await asyncio.sleep(LONG)

    @app.task(
        "bench:at_limit",
        queue=QUEUE,
        max_retry=0,
        limit=durq.Limit("busy", concurrency=AT_LIMIT[0]),
    )
    async def at_limit(payload: dict[str, Any]) -> None:
        start = time.time()
        await asyncio.sleep(AT_LIMIT[1])
        record("at_limit", start)

    @app.task("bench:rated", queue=QUEUE, max_retry=0, limit=durq.Limit("api", rate=f"{RATE}/s"))
    async def rated(payload: dict[str, Any]) -> None:
        record("rated", time.time())

    return app


# `durq worker limits:app` imports this module; the broker comes from DURQ_BROKER_URL.
app = build(os.environ.get("DURQ_BROKER_URL", "memory://"))


# -- the parent --------------------------------------------------------------------------------


async def scenario(
    base: str | None, items: list[tuple[str, int]], watched: str, concurrency: int
) -> dict[str, Any]:
    """Queue ``items`` (type, count) in order, run ``durq worker`` until the ``watched``
    tasks (``bench:<kind>``) have all ended; their lines and the worker's whole-life CPU."""
    isolated = Isolated.create(base)
    await isolated.prepare()
    signals = tempfile.mkdtemp(prefix="durq-limits-")
    try:
        producer = build(isolated.url)
        try:
            for task_type, count in items:
                for first in range(0, count, 1000):
                    n = min(1000, count - first)
                    await producer.enqueue_many([EnqueueRequest(task_type, {}) for _ in range(n)])
        finally:
            await producer.close()
        expected = dict(items)[f"bench:{watched}"]
        cpu_before = _children_cpu()
        with open(os.path.join(signals, "worker.log"), "wb") as log:
            args = worker_args(concurrency)
            proc = durq_worker("limits:app", isolated.url, signals, log, *args)
            try:
                await _wait(lambda: ended(signals, watched) >= expected, 600, watched, proc)
            finally:
                _stop(proc)
        rows = lines(signals, watched)
        return {"rows": rows, "worker_cpu_s": _children_cpu() - cpu_before}
    finally:
        for path in glob.glob(os.path.join(signals, "*")):
            os.remove(path)
        os.rmdir(signals)
        await isolated.cleanup()


def worker_args(concurrency: int) -> list[str]:
    """The README's worker (INFO logging), on the bench queue; a zero shutdown timeout hands
    the sleeping tasks back at once when the parent stops it."""
    return ["--queues", QUEUE, "--concurrency", str(concurrency), "--shutdown-timeout", "0"]


def throughput(rows: list[tuple[float, float, float]]) -> float:
    """Tasks per second from the first start to the last end."""
    return len(rows) / (max(end for _, end, _ in rows) - rows[0][0])


def cpu_per_task_us(rows: list[tuple[float, float, float]]) -> float:
    """The worker's CPU between the first and the last of these tasks, per task."""
    cpus = [cpu for _, _, cpu in rows]
    return 1e6 * (max(cpus) - min(cpus)) / (len(rows) - 1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    c, n = args.concurrency, args.tasks
    queued = {
        "unlimited": [("bench:free", n)],
        "unlimited_with_held": [("bench:held", args.held), ("bench:free", n)],
        "unlimited_beside_busy": [("bench:busy", 1), ("bench:free", n)],
        "unlimited_with_rate_held": [("bench:rate_held", args.held), ("bench:free", n)],
    }
    rates: dict[str, list[float]] = {name: [] for name in queued}
    cpus: dict[str, list[float]] = {name: [] for name in queued}
    lives: dict[str, list[float]] = {name: [] for name in queued}
    for _ in range(args.rounds):
        for name, items in queued.items():
            r = await scenario(args.broker, items, "free", c)
            rates[name].append(throughput(r["rows"]))
            cpus[name].append(cpu_per_task_us(r["rows"]))
            lives[name].append(r["worker_cpu_s"])
    k = AT_LIMIT[0] * 40
    r = await scenario(args.broker, [("bench:at_limit", k)], "at_limit", c)
    at_limit = throughput(r["rows"])
    r = await scenario(args.broker, [("bench:rated", RATE * 10)], "rated", c)
    steady = [start for start, _, _ in r["rows"]][RATE:]  # after the first full bucket
    at_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    rate = {name: statistics.median(runs) for name, runs in rates.items()}
    cpu = {name: statistics.median(runs) for name, runs in cpus.items()}

    def change(figures: dict[str, float], name: str, base: str) -> float:
        return round(100 * (figures[name] - figures[base]) / figures[base], 1)

    def paired(runs: dict[str, list[float]], name: str, base: str) -> float:
        """The median of each round's change against the base run of the same round."""
        ratios = [a / b for a, b in zip(runs[name], runs[base], strict=True)]
        return round(100 * (statistics.median(ratios) - 1), 1)

    def versus(name: str, base: str) -> dict[str, float]:
        return {
            "per_s": change(rate, name, base),
            "cpu": change(cpu, name, base),
            "per_s_paired": paired(rates, name, base),
            "cpu_paired": paired(cpus, name, base),
        }

    return {
        "broker": redact(args.broker) if args.broker else "sqlite (temporary file)",
        "worker": shlex.join(["durq", "worker", "limits:app", *worker_args(c)]),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tasks": n,
        "held_tasks": args.held - 1,
        # Unlimited tasks per second, medians of the rounds and every run.
        "per_s": {name: round(rate[name], 1) for name in queued},
        "per_s_runs": {name: [round(x, 1) for x in runs] for name, runs in rates.items()},
        # The worker's CPU per unlimited task (us): steadier than throughput on a loaded
        # machine; on SQLite it includes the database work, elsewhere the client's.
        "cpu_us": {name: round(cpu[name], 1) for name in queued},
        "cpu_us_runs": {name: [round(x) for x in runs] for name, runs in cpus.items()},
        # The worker process's whole life (start-up, holding the held tasks, shutdown), from
        # its rusage once it has exited: seconds, median of the rounds.
        "worker_life_cpu_s": {
            name: round(statistics.median(runs), 3) for name, runs in lives.items()
        },
        "with_held_vs_unlimited_pct": versus("unlimited_with_held", "unlimited"),
        "with_held_vs_beside_busy_pct": versus("unlimited_with_held", "unlimited_beside_busy"),
        "with_rate_held_vs_unlimited_pct": versus("unlimited_with_rate_held", "unlimited"),
        "at_limit": {
            "concurrency": AT_LIMIT[0],
            "task_seconds": AT_LIMIT[1],
            "expected_per_s": AT_LIMIT[0] / AT_LIMIT[1],
            "measured_per_s": round(at_limit, 1),
        },
        "at_rate": {"rate_per_s": RATE, "measured_starts_per_s": round(at_rate, 1)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=None, help="broker URL (default: temporary SQLite)")
    parser.add_argument("--concurrency", type=int, default=10, help="durq worker --concurrency")
    parser.add_argument("--tasks", type=int, default=3000, help="unlimited tasks per run")
    parser.add_argument("--held", type=int, default=1000, help="limited tasks queued ahead")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
