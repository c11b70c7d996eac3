"""Throughput on a local Redis Cluster (3 masters, 3 replicas) beside one Redis node, in the
same run, with the CPU each redis-server process used.

Starts its own servers on free loopback ports (nothing shared is touched): one redis-server,
then a cluster like the test suite's. On each broker: N enqueues from C concurrent producers
(``App.enqueue``, one task at a time, spread over Q queues, i.e. over every master), then one
worker (``concurrency`` 100) runs them all (a no-op handler). The cluster runs twice: with
asynchronous replication and with ``wait_replicas=1`` (each enqueue and outcome waits for a
replica). CPU seconds come from ``/proc/<pid>/stat`` of each server and of this process.

    .venv/bin/python benchmarks/redis_cluster.py --tasks 20000 --queues 12 --producers 64
        [--wait-first]   (order matters on a loaded machine: run both orders)

On a machine with fewer cores than processes (6 cluster nodes, the client) the cluster cannot
be faster than one node: the figures show what it costs, not what it scales to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import durq
from durq.brokers.redis.cluster import key_slot
from servers import PrivateRedis, RedisCluster

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Meter:
    """CPU seconds used by each server process and by this one over a phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = {**pids, "client": os.getpid()}
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.t0 = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        used = {name: cpu_seconds(pid) - self.start[name] for name, pid in self.pids.items()}
        return {
            "seconds": round(wall, 2),
            "cpu_seconds": {name: round(s, 2) for name, s in used.items()},
            "cpu_share": {name: round(s / wall, 2) for name, s in used.items()},
        }


def queue_names(queues: int, masters: dict[int, list[tuple[int, int]]] | None) -> list[str]:
    """``queues`` names, as many on each master as can be (round robin over the masters)."""
    if not masters:
        return [f"q{i}" for i in range(queues)]
    by_master: dict[int, list[str]] = {port: [] for port in masters}
    i = 0
    while sum(map(len, by_master.values())) < queues:
        name, i = f"q{i}", i + 1
        slot = key_slot(f"{{{name}}}")
        port = next(p for p, r in masters.items() if any(s <= slot <= e for s, e in r))
        if len(by_master[port]) < -(-queues // len(masters)):
            by_master[port].append(name)
    return sorted(n for names in by_master.values() for n in names)[:queues]


async def run(url: str, pids: dict[str, int], names: list[str], tasks: int, producers: int) -> dict:
    queues = len(names)
    app = durq.App(url)
    done = asyncio.Event()
    handled = 0

    for name in names:

        @app.task(f"bench:{name}", queue=name, retention=0)
        async def noop(payload: Any) -> None:
            nonlocal handled
            handled += 1
            if handled == tasks:
                done.set()

    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    await app.enqueue(f"bench:{names[0]}", {})  # connect and load the scripts first
    await app.inspector.delete_all(names[0], "pending")

    counter = iter(range(tasks))

    async def produce() -> None:
        for i in counter:
            await app.enqueue(f"bench:{names[i % queues]}", {"i": i})

    meter = Meter(pids)
    await asyncio.gather(*[produce() for _ in range(producers)])
    enqueue = meter.stop()
    meter = Meter(pids)
    async with app.worker(queues=names, concurrency=100, summary_interval=None):
        await asyncio.wait_for(done.wait(), 600)
    process = meter.stop()
    await app.close()
    return {
        "enqueue_per_s": round(tasks / enqueue["seconds"]),
        "process_per_s": round(tasks / process["seconds"]),
        "enqueue": enqueue,
        "process": process,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--queues", type=int, default=12)
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument(
        "--wait-first", action="store_true", help="the wait_replicas=1 run before the other"
    )
    args = parser.parse_args(argv)
    logging.getLogger("durq").setLevel(logging.ERROR)  # no durability warning: no AOF here
    out: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="durq-cluster-bench-"))

    def measure(label: str, url: str, pids: dict[str, int], names: list[str]) -> None:
        figures = asyncio.run(run(url, pids, names, args.tasks, args.producers))
        row = {"broker": label, "tasks": args.tasks, "queues": len(names), **figures}
        out.append(row)
        print(json.dumps(row), flush=True)

    single = PrivateRedis(work / "single", "--appendonly", "no")
    try:
        assert single.proc is not None
        measure(
            "redis (one node)",
            single.url + "?prefix=bench",
            {"redis": single.proc.pid},
            queue_names(args.queues, None),
        )
    finally:
        single.kill()
    cluster = RedisCluster(work / "cluster")
    try:
        masters = cluster.masters()
        roles: Callable[[int], str] = lambda p: "master" if p in masters else "replica"  # noqa: E731
        pids = {f"{roles(p)}:{p}": cluster.nodes[p].pid for p in cluster.ports}
        names = queue_names(args.queues, masters)
        print(json.dumps({"queues": names}), flush=True)
        runs = [
            ("redis cluster 3+3", cluster.url("bench")),
            ("redis cluster 3+3, wait_replicas=1", cluster.url("bench2") + "&wait_replicas=1"),
        ]
        for label, url in reversed(runs) if args.wait_first else runs:
            measure(label, url, pids, names)
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
