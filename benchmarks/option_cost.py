"""What ``Unique(...)`` and ``fair=True`` cost per enqueue and per claim against plain tasks,
in counted instructions (load-independent), per broker; same build, same run.

Four ways of the same task (payload ``{"tenant": "t<i % 10>", "account": i}``):

* ``plain``: no option;
* ``unique``: ``Unique(keys=["account"])`` (every task its own key: the cost when no twin
  holds it);
* ``limited``: ``Limit("tenant:{tenant}", concurrency=1000)``;
* ``fair``: the same limit with ``fair=True``.

The client's instructions are counted as ``check.py`` counts them (callgrind, once with N1 and
once with N2 tasks, the difference over N2 - N1; every thread of the process, SQLite's too):

* ``enqueue``: ``app.enqueue`` one after another;
* ``claim``: a claim of one task (``Broker.claim``, limit 1), tasks put there by
  ``enqueue_many`` of the same way, whose own count is taken off.

The server's share, where there is a server: Redis, the instructions of a private
``redis-server`` run under callgrind (N1 and N2 again, the client not under valgrind);
PostgreSQL, the CPU time its backends serving the run spent per call (``/proc/<pid>/schedstat``
of the backends named by the run's ``application_name``; CPU time, not wall time, but a
loaded machine still moves it a little).

    .venv/bin/python benchmarks/option_cost.py [--brokers memory,sqlite,postgresql,redis]
        [--sizes 100,300] [--ways plain,unique,limited,fair] [--jobs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from check import POSTGRES_URL, collected, count

HERE = Path(__file__).resolve()
WAYS = ("plain", "unique", "limited", "fair")
STEPS = ("enqueue", "bulk", "claim")


def options(way: str) -> dict[str, Any]:
    """The enqueue options of a way."""
    import durq

    return {
        "plain": {},
        "unique": {"unique": durq.Unique(keys=["account"])},
        "limited": {"limit": durq.Limit("tenant:{tenant}", concurrency=1000)},
        "fair": {"limit": durq.Limit("tenant:{tenant}", concurrency=1000, fair=True)},
    }[way]


def workload(url: str, step: str, tasks: int, way: str) -> None:
    """The measured program: a warm-up of every path, then ``tasks`` of ``step``. With
    ``DURQ_COST_SERVER`` set it prints the server's CPU nanoseconds of the measured part
    (PostgreSQL)."""
    os.environ["PGAPPNAME"] = f"durq-cost-{uuid.uuid4().hex[:12]}"
    import durq
    from durq.brokers.base import ClaimParams
    from durq.options import EnqueueRequest

    app = durq.App(url)
    opts = options(way)

    @app.task("noop", retention=0)
    async def noop(payload: dict[str, Any]) -> None:
        """Never run: only enqueued and claimed."""

    def payload(i: int) -> dict[str, Any]:
        return {"tenant": f"t{i % 10}", "account": i}

    async def bulk(first: int, n: int) -> None:
        for start in range(first, first + n, 500):
            stop = min(first + n, start + 500)
            await app.enqueue_many(
                [EnqueueRequest("noop", payload(i), **opts) for i in range(start, stop)]
            )

    async def run() -> None:
        broker = app.new_broker()
        await broker.connect()
        claim = ClaimParams(["default"], 1, "cost", 300.0)
        # Warm-up: every step once, so that what runs only the first time cancels out.
        await app.enqueue("noop", payload(-1), **opts)
        await bulk(-3, 2)
        for _ in range(3):
            await broker.claim(claim)
        if step == "claim" or step == "bulk":
            await bulk(0, tasks)
        server = await server_clock(url)
        if step == "enqueue":
            for i in range(tasks):
                await app.enqueue("noop", payload(i), **opts)
        elif step == "claim":
            for _ in range(tasks):
                assert await broker.claim(claim)
        if server is not None:
            print(f"server_ns={await server():.0f}", flush=True)
        await broker.close()
        await app.close()

    asyncio.run(run())


async def server_clock(url: str) -> Any:
    """For a PostgreSQL run measured for its server (``DURQ_COST_SERVER``): a coroutine that
    gives the CPU nanoseconds this run's backends spent since now; else ``None``."""
    if not os.environ.get("DURQ_COST_SERVER") or not url.startswith("postgres"):
        return None
    import psycopg

    dsn = re.sub(r"[?&]schema=[^&]*", "", url)
    name = os.environ["PGAPPNAME"]

    async def spent() -> dict[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn, application_name="cost-probe") as c:
            cur = await c.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            )
            pids = [row[0] for row in await cur.fetchall()]
        return {pid: int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) for pid in pids}

    before = await spent()

    async def since() -> float:
        after = await spent()
        return float(sum(ns - before.get(pid, 0) for pid, ns in after.items()))

    return since


def server_ns(python: str, step: str, tasks: int, way: str, rounds: int = 3) -> float:
    """PostgreSQL: the backends' CPU nanoseconds per call (median of ``rounds`` runs)."""
    from durq.bench.isolation import Isolated

    seen = []
    for _ in range(rounds):
        isolated = Isolated.create(POSTGRES_URL)
        try:
            asyncio.run(isolated.prepare())
            env = {**os.environ, "DURQ_COST_SERVER": "1", "PYTHONHASHSEED": "0"}
            cmd = [python, str(HERE), "workload", isolated.url, step, str(tasks), way]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            seen.append(float(re.findall(r"server_ns=(\d+)", done.stdout)[-1]) / tasks)
        finally:
            asyncio.run(isolated.cleanup())
    return statistics.median(seen)


def redis_server_count(python: str, step: str, tasks: int, way: str) -> int:
    """Instructions of a private ``redis-server`` under callgrind serving one run."""
    with tempfile.TemporaryDirectory(prefix="durq-cost-") as tmp:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        server = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/server.out"]
        # --hz 1: fewer background ticks, whose number follows how long a run takes, not N.
        server += ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
        server += ["--dir", tmp, "--hz", "1"]
        log = Path(tmp) / "server.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(server, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while (
                subprocess.run(
                    ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
                ).stdout.strip()
                != "PONG"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the private redis-server did not start")
                time.sleep(0.2)
            url = f"redis://127.0.0.1:{port}/0"
            cmd = [python, str(HERE), "workload", url, step, str(tasks), way]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        finally:
            subprocess.run(
                ["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True
            )
            proc.wait(60)
        return collected(log.read_text())


def plan(ways: list[str], claim_ways: list[str]) -> list[tuple[str, str]]:
    """The (step, way) pairs to count: every way's enqueue; the claim ways' claim and bulk."""
    return [("enqueue", w) for w in ways] + [
        (step, w) for w in claim_ways for step in ("bulk", "claim")
    ]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        workload(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="memory,sqlite,postgresql,redis")
    parser.add_argument("--ways", default="plain,unique,fair", help="enqueues counted")
    parser.add_argument("--claim-ways", default="plain,fair", help="claims counted")
    parser.add_argument("--sizes", default="100,300", help="N1,N2 tasks")
    parser.add_argument("--server-tasks", type=int, default=1000, help="PostgreSQL server runs")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    brokers = args.brokers.split(",")
    steps = plan(args.ways.split(","), args.claim_ways.split(","))
    n1, n2 = (int(n) for n in args.sizes.split(","))
    urls = {
        "memory": "memory://",
        "sqlite": "sqlite:///",
        "postgresql": POSTGRES_URL,
        "redis": "redis://127.0.0.1:6379/14",
    }

    def one(run: tuple[str, str, str, int]) -> float:
        side, broker, step, way, n = run[0], *run[1:]  # type: ignore[misc]
        if side == "server":
            got = float(redis_server_count(args.python, step, n, way))
        else:
            got = float(count(args.python, urls[broker], step, n, way, script=HERE))
        print(f"{side} {broker} {step} {way} {n}: {got:,.0f}", file=sys.stderr, flush=True)
        return got

    runs = [("client", b, s, w, n) for b in brokers for s, w in steps for n in (n1, n2)]
    if "redis" in brokers:
        runs += [("server", "redis", s, w, n) for s, w in steps for n in (n1, n2)]
    with ThreadPoolExecutor(args.jobs) as pool:
        counted = dict(zip(runs, pool.map(one, runs), strict=True))
    figures: dict[tuple[str, str, str, str], float] = {}
    for side, broker, step, way, n in runs:
        if n == n2:
            high, low = counted[side, broker, step, way, n2], counted[side, broker, step, way, n1]
            figures[side, broker, step, way] = (high - low) / (n2 - n1)
    for (side, broker, step, way), value in list(figures.items()):
        if step == "claim":  # the claim's own share: the tasks' bulk enqueue taken off
            figures[side, broker, step, way] = value - figures[side, broker, "bulk", way]
    if "postgresql" in brokers:
        for step, way in steps:
            if step != "bulk":
                figures["server", "postgresql", step, way] = server_ns(
                    args.python, step, args.server_tasks, way
                )
    print(f"\ninstructions per call (callgrind, N = {n1},{n2}), ratio to plain\n")
    print("| broker | call | way | client | ratio | server | ratio |")
    print("|---|---|---|---:|---:|---:|---:|")
    for broker in brokers:
        for call in ("enqueue", "claim"):
            for step, way in steps:
                if step != call:
                    continue
                client = figures["client", broker, call, way]
                base = figures["client", broker, call, "plain"]
                server = figures.get(("server", broker, call, way))
                cells = ["-", "-"]
                if server is not None:
                    plain = figures["server", broker, call, "plain"]
                    unit = "k instructions" if broker == "redis" else " µs CPU"
                    cells = [f"{server / 1000:,.1f}{unit}", f"{server / plain:.2f}"]
                print(
                    f"| {broker} | {call} | {way} | {client / 1000:,.1f}k | "
                    f"{client / base:.2f} | {cells[0]} | {cells[1]} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
