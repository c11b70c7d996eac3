"""Server connections of real ``durq worker`` processes: workers x processes → connections.

For each broker (PostgreSQL, Redis) and each combination of ``--workers`` (``durq worker``
commands, as on separate machines) and ``--processes`` (their ``--processes N``), this starts
the real CLI against an isolated schema or key prefix, and counts the server's connections
that carry a tag of the run: PostgreSQL's ``pg_stat_activity`` by ``application_name``, Redis's
``CLIENT LIST`` by ``client_name`` (both set through the broker URL, as a user would):

* ``idle``: once every worker process has registered and the queue is empty;
* ``noop``: the peak while the workers drain ``--tasks`` no-op tasks;
* ``enqueue``: the peak while they drain tasks whose handler enqueues another task.

Then, once per broker: an enqueue-only client (a web process), the inspector (``durq queue``,
the dashboard), and a worker with ``--metrics-port``, idle and once ``/metrics``, ``/readyz``
and ``/healthz`` were read (with ``--processes 2`` the supervisor reads the queue gauges and
answers the probes). The producer and the monitor use other tags, so they
are not counted. Everything is removed at the end.

    .venv/bin/python benchmarks/connections.py [--pg postgresql://postgres@127.0.0.1:5432/test]
        [--redis redis://127.0.0.1:6379/0] [--workers 1,2] [--processes 1,2,4]
        [--concurrency 10] [--tasks 400] [--only postgresql|redis] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from durq import App
from durq.app import EnqueueRequest
from durq.bench.isolation import Isolated, _with_param

HERE = Path(__file__).resolve().parent
QUEUE = "conn"

#: The app the worker processes run (``durq worker connections:app`` from this folder).
app = App("memory://connections")


@app.task("conn:noop", queue=QUEUE, max_retry=0)
async def noop(payload: dict[str, Any]) -> None:
    """Does nothing."""


@app.task("conn:fanout", queue=QUEUE, max_retry=0)
async def fanout(payload: dict[str, Any]) -> None:
    """Enqueues one no-op: a handler that enqueues, through the app."""
    await noop.enqueue({})


class Counter:
    """Counts the server connections whose name is ``tag``."""

    def __init__(self, kind: str, base: str, tag: str) -> None:
        self.kind, self.base, self.tag = kind, base, tag
        self._conn: Any = None

    async def open(self) -> None:
        if self.kind == "postgresql":
            import psycopg

            self._conn = await psycopg.AsyncConnection.connect(self.base, autocommit=True)
        else:
            import redis.asyncio as aioredis

            self._conn = aioredis.Redis.from_url(self.base)

    async def count(self) -> int:
        if self.kind == "postgresql":
            cur = await self._conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (self.tag,)
            )
            row = await cur.fetchone()
            return int(row[0])
        clients = await self._conn.client_list()
        return sum(1 for c in clients if c.get("name") == self.tag)

    async def close(self) -> None:
        if self._conn is not None:
            await (self._conn.close() if self.kind == "postgresql" else self._conn.aclose())

    @contextlib.asynccontextmanager
    async def peak(self) -> AsyncIterator[list[int]]:
        """Samples the count every 50 ms while the block runs; ``[peak]`` afterwards."""
        result = [await self.count()]
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                result[0] = max(result[0], await self.count())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.05)

        sampler = asyncio.create_task(sample())
        try:
            yield result
        finally:
            done.set()
            await sampler


def tagged(kind: str, url: str, tag: str) -> str:
    """``url`` with the connection name ``tag`` (application_name or client_name)."""
    return _with_param(url, "application_name" if kind == "postgresql" else "client_name", tag)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_workers(
    url: str, workers: int, processes: int, concurrency: int, metrics: int | None = None
) -> list[asyncio.subprocess.Process]:
    durq = str(Path(sys.executable).with_name("durq"))
    procs = []
    for _ in range(workers):
        argv = [durq, "worker", "connections:app", "--broker", url, "--log-level", "WARNING"]
        argv += ["--processes", str(processes), "--concurrency", str(concurrency)]
        if metrics is not None:
            argv += ["--metrics-port", str(metrics)]
        procs.append(
            await asyncio.create_subprocess_exec(
                *argv, cwd=HERE, stdin=asyncio.subprocess.DEVNULL, env=dict(os.environ)
            )
        )
    return procs


async def stop_workers(procs: list[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def drain(producer: App, kind: str, count: int, done_before: int) -> int:
    """Enqueue ``count`` tasks of ``kind`` and wait until the workers processed them all."""
    expected = done_before + count * (2 if kind == "conn:fanout" else 1)
    for start in range(0, count, 500):
        batch = [EnqueueRequest(kind, {}, queue=QUEUE) for _ in range(min(500, count - start))]
        await producer.enqueue_many(batch)

    async def processed() -> bool:
        stats = await producer.inspector.queue_stats(QUEUE)
        return stats.processed_total >= expected

    await until(processed, 120, f"{expected} processed tasks")
    return expected


async def measure_grid(
    kind: str, base: str, workers: int, processes: int, concurrency: int, tasks: int
) -> dict[str, Any]:
    tag = f"durqconn{uuid.uuid4().hex[:8]}"
    place = Isolated.create(tagged(kind, base, tag))
    await place.prepare()
    counter = Counter(kind, base, tag)
    await counter.open()
    producer = App(tagged(kind, place.url, tag + "p"))
    procs: list[asyncio.subprocess.Process] = []
    try:
        procs = await start_workers(place.url, workers, processes, concurrency)

        async def registered() -> bool:
            return len(await producer.inspector.list_workers()) >= workers * processes

        await until(registered, 120, "the workers to register")
        await asyncio.sleep(3.0)  # past the first heartbeat and maintenance ticks
        idle = await counter.count()
        async with counter.peak() as noop_peak:
            done = await drain(producer, "conn:noop", tasks, 0)
        async with counter.peak() as enqueue_peak:
            await drain(producer, "conn:fanout", tasks // 2, done)
        return {
            "broker": kind,
            "workers": workers,
            "processes": processes,
            "concurrency": concurrency,
            "idle": idle,
            "noop": noop_peak[0],
            "enqueue": enqueue_peak[0],
        }
    finally:
        await stop_workers(procs)
        await producer.close()
        await counter.close()
        await place.cleanup()


async def measure_extras(kind: str, base: str, concurrency: int) -> list[dict[str, Any]]:
    """An enqueue-only client, the inspector, and a supervisor that serves metrics."""
    tag = f"durqconn{uuid.uuid4().hex[:8]}"
    place = Isolated.create(tagged(kind, base, tag))
    await place.prepare()
    counter = Counter(kind, base, tag)
    await counter.open()
    rows: list[dict[str, Any]] = []
    try:
        client = App(place.url)
        await client.enqueue("conn:noop", {}, queue=QUEUE)
        rows.append(
            {"broker": kind, "what": "enqueue-only app", "connections": await counter.count()}
        )
        await client.inspector.list_queues()
        await client.inspector.list_workers()
        rows.append(
            {"broker": kind, "what": "same app + inspector", "connections": await counter.count()}
        )
        await client.close()
        for processes in (1, 2):
            port = free_port()
            procs = await start_workers(place.url, 1, processes, concurrency, metrics=port)
            try:
                producer = App(tagged(kind, place.url, tag + "p"))

                async def registered(n: int = processes, p: App = producer) -> bool:
                    return len(await p.inspector.list_workers()) >= n

                await until(registered, 120, "the workers to register")
                await producer.close()
                await asyncio.sleep(3.0)
                label = f"1 worker --processes {processes} --metrics-port"
                rows.append(
                    {"broker": kind, "what": f"{label}, idle", "connections": await counter.count()}
                )
                await asyncio.to_thread(scrape, port)
                rows.append(
                    {
                        "broker": kind,
                        "what": f"{label}, scraped",
                        "connections": await counter.count(),
                    }
                )
            finally:
                await stop_workers(procs)
    finally:
        await counter.close()
        await place.cleanup()
    return rows


def scrape(port: int) -> None:
    """What Prometheus and the orchestrator's probes do: /metrics and /readyz."""
    for path in ("/metrics", "/readyz", "/healthz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
            reply.read()


def print_table(grid: list[dict[str, Any]], extras: list[dict[str, Any]]) -> None:
    print(
        f"{'broker':<11} {'workers':>7} {'procs':>5} {'conc':>4} {'idle':>5} {'noop':>5} "
        f"{'enqueue':>7}   per process (idle/noop/enqueue)"
    )
    for r in grid:
        n = r["workers"] * r["processes"]
        per = "/".join(f"{r[k] / n:.1f}" for k in ("idle", "noop", "enqueue"))
        print(
            f"{r['broker']:<11} {r['workers']:>7} {r['processes']:>5} {r['concurrency']:>4} "
            f"{r['idle']:>5} {r['noop']:>5} {r['enqueue']:>7}   {per}"
        )
    print()
    for e in extras:
        print(f"{e['broker']:<11} {e['what']:<48} {e['connections']:>3}")


async def main_async(args: argparse.Namespace) -> None:
    bases = {"postgresql": args.pg, "redis": args.redis}
    kinds = [args.only] if args.only else list(bases)
    grid: list[dict[str, Any]] = []
    extras: list[dict[str, Any]] = []
    for kind in kinds:
        for workers in args.workers:
            for processes in args.processes:
                row = await measure_grid(
                    kind, bases[kind], workers, processes, args.concurrency, args.tasks
                )
                grid.append(row)
                print(json.dumps(row), file=sys.stderr)
        extras += await measure_extras(kind, bases[kind], args.concurrency)
    if args.json:
        print(json.dumps({"grid": grid, "extras": extras}, indent=2))
    else:
        print_table(grid, extras)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--workers", type=ints, default=[1, 2])
    parser.add_argument("--processes", type=ints, default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--only", choices=["postgresql", "redis"])
    parser.add_argument("--json", action="store_true")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
