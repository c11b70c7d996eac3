"""What ``Unique(...)`` and ``fair=True`` cost per enqueue and per claim against plain tasks,
in counted instructions (load-independent), per broker, in one run.

Three ways of the same task (payload ``{"tenant": "t<i % 10>", "account": i}``), each in a
queue of its own:

* ``plain``: no option;
* ``unique``: ``Unique(keys=["account"])`` (every task its own key: the cost when no twin
  holds it);
* ``fair``: ``Limit("tenant:{tenant}", concurrency=1000, fair=True)``; and ``limited``, the
  same limit without ``fair=True``, to tell the limit's cost from fairness's.

Sections, ``-n`` calls each after a warm-up of every path, in ``--rounds`` rounds (the least
count of a section's rounds is kept): ``enqueue`` (``app.enqueue`` one
after another) of each way, and ``claim`` (``Broker.claim`` of one task, the tasks put there
beforehand by ``enqueue_many``) of each way but ``unique``.

The client's instructions: the process runs under ``valgrind --tool=callgrind
--instr-atstart=no`` and counts only inside each section (``callgrind_marks.c``, built here
with gcc), every thread of the process (SQLite's too). The server's share: Redis, a private
``redis-server`` under callgrind, its count zeroed and dumped around each section
(``callgrind_control``; its hz is 1, so its own timer adds little); PostgreSQL, the CPU time
the run's backends spent in the section (``/proc/<pid>/schedstat`` of the backends named by
the run's ``application_name``: CPU time, not wall time, though a loaded machine still moves
it a little). SQLite's background WAL checkpoint, which runs on a timer, is held off.

    .venv/bin/python benchmarks/option_cost.py [--brokers memory,sqlite,postgresql,redis]
        [-n 300]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from callgrind import section_counts
from check import POSTGRES_URL

HERE = Path(__file__).resolve()
MARKS = HERE.parent / "callgrind_marks.c"
ENQUEUE_WAYS = ("plain", "unique", "limited", "fair")
CLAIM_WAYS = ("plain", "limited", "fair")
#: Rounds of every section in one run, the order of the ways turned round each time.
ROUNDS = 2


@functools.cache
def options(way: str) -> dict[str, Any]:
    """The enqueue options of a way, built once: building them in every call counted the
    construction of all four ways' options (``Unique`` about 64k instructions, a ``Limit``
    24k) in every way's enqueue, plain included."""
    import durq

    return {
        "plain": {},
        "unique": {"unique": durq.Unique(keys=["account"])},
        "limited": {"limit": durq.Limit("tenant:{tenant}", concurrency=1000)},
        "fair": {"limit": durq.Limit("tenant:{tenant}", concurrency=1000, fair=True)},
    }[way]


class Marks:
    """Start and stop counting around a section: callgrind's client requests (the client),
    the private server's counters (Redis) or its backends' CPU time (PostgreSQL)."""

    def __init__(self, url: str, lib: str | None, server_pid: int | None) -> None:
        self.url, self.server_pid = url, server_pid
        self.lib = ctypes.CDLL(lib) if lib else None
        self.server: dict[str, float] = {}
        self._cpu: dict[int, int] = {}

    async def section(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        if self.server_pid is not None:
            _control("-z", self.server_pid)
        if self.url.startswith("postgres"):
            self._cpu = await _backend_cpu(self.url)
        if self.lib is not None:
            self.lib.durq_cg_start()
        await body()
        if self.lib is not None:
            self.lib.durq_cg_stop(name.encode())
        if self.url.startswith("postgres"):
            after = await _backend_cpu(self.url)
            spent = sum(ns - self._cpu.get(pid, 0) for pid, ns in after.items())
            self.server[name] = min(self.server.get(name, spent), spent)
        if self.server_pid is not None:
            _control("-d", self.server_pid, name)


def _control(flag: str, pid: int, *more: str) -> None:
    subprocess.run(["callgrind_control", flag, *more, str(pid)], capture_output=True, check=True)


async def _backend_cpu(url: str) -> dict[int, int]:
    """CPU nanoseconds so far of each backend serving this process (its application_name)."""
    import psycopg

    dsn = re.sub(r"[?&]schema=[^&]*", "", url)
    async with await psycopg.AsyncConnection.connect(dsn, application_name="cost-probe") as c:
        cur = await c.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (os.environ["PGAPPNAME"],),
        )
        pids = [row[0] for row in await cur.fetchall()]
    return {pid: int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) for pid in pids}


def workload(url: str, n: int, rounds: int, section: str) -> None:
    """The measured program: a warm-up of every path of the section's way, then ``rounds``
    of the section (``"enqueue plain"``, ``"claim fair"``...), each of ``n`` calls. One
    section a process, as check.py runs one step a process: a section measured after
    another's in the same process counted work the earlier one had left (a plain claim
    after the enqueues showed a tenth of its own count)."""
    os.environ["PGAPPNAME"] = f"durq-cost-{uuid.uuid4().hex[:12]}"
    import durq
    from durq.brokers.base import ClaimParams

    # SQLite's background WAL checkpoint runs on a timer after commits: its share would follow
    # how long a section took under valgrind, not its calls. Held off here; the automatic
    # checkpoint inside a commit (by log size) still runs.
    from durq.brokers.sqlite import checkpoint
    from durq.options import EnqueueRequest

    kwdefaults = checkpoint.Checkpointer.__init__.__kwdefaults__
    assert kwdefaults is not None
    kwdefaults["delay"] = 1e9
    app = durq.App(url)
    server_pid = os.environ.get("DURQ_COST_SERVER_PID")
    marks = Marks(url, os.environ.get("DURQ_COST_MARKS"), int(server_pid) if server_pid else None)
    ids = iter(range(10**9))

    @app.task("noop", retention=0)
    async def noop(payload: dict[str, Any]) -> None:
        """Never run: only enqueued and claimed."""

    def payload() -> dict[str, Any]:
        i = next(ids)
        return {"tenant": f"t{i % 10}", "account": i}

    async def enqueue(way: str, count: int) -> None:
        for _ in range(count):
            await app.enqueue("noop", payload(), queue=way, **options(way))

    async def bulk(way: str, count: int) -> None:
        for start in range(0, count, 500):
            await app.enqueue_many(
                [
                    EnqueueRequest("noop", payload(), queue=way, **options(way))
                    for _ in range(min(500, count - start))
                ]
            )

    async def run() -> None:
        broker = app.new_broker()
        await broker.connect()

        async def claim(way: str, count: int) -> None:
            params = ClaimParams([way], 1, "cost", 300.0)
            for _ in range(count):
                assert await broker.claim(params)

        call, way = section.split()
        await enqueue(way, 3)  # warm-up: what runs only the first time stays out
        await bulk(way, 3)
        await claim(way, 3)
        for _ in range(rounds):
            if call == "claim":
                await bulk(way, n)
                await marks.section(section, partial(claim, way, n))
            else:
                await marks.section(section, partial(enqueue, way, n))
        print("server=" + json.dumps(marks.server), flush=True)
        await broker.close()
        await app.close()

    asyncio.run(run())


def run_client(python: str, url: str, n: int, tmp: str, lib: str, section: str) -> dict[str, int]:
    """The client's instructions per section (the process under callgrind)."""
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={tmp}/c"]
    cmd += [python, str(HERE), "workload", url, str(n), str(ROUNDS), section]
    env = {**os.environ, "PYTHONHASHSEED": "0", "DURQ_COST_MARKS": lib}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"client run on {url} failed: {done.stderr[-2000:]}")
    return section_counts(f"{tmp}/c")


def run_postgres_server(python: str, url: str, n: int, section: str) -> dict[str, float]:
    """The PostgreSQL backends' CPU nanoseconds per section (client not under valgrind)."""
    cmd = [python, str(HERE), "workload", url, str(n), str(ROUNDS), section]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.split("server=")[-1]))


def run_redis_server(python: str, n: int, tmp: str, section: str) -> dict[str, int]:
    """A private ``redis-server`` under callgrind: its instructions per section."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/server"]
    # --hz 1: fewer background ticks, whose number follows how long a run takes, not N.
    server += ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    server += ["--dir", tmp, "--hz", "1"]
    with open(Path(tmp) / "server.log", "w") as out:
        proc = subprocess.Popen(server, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        ping = ["redis-cli", "-p", str(port), "ping"]
        while subprocess.run(ping, capture_output=True, text=True).stdout.strip() != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("the private redis-server did not start")
            time.sleep(0.2)
        env = {**os.environ, "DURQ_COST_SERVER_PID": str(proc.pid)}
        url = f"redis://127.0.0.1:{port}/0"
        cmd = [python, str(HERE), "workload", url, str(n), str(ROUNDS), section]
        subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        proc.wait(60)
    return section_counts(f"{tmp}/server")


def measure_section(python: str, broker: str, n: int, lib: str, section: str) -> dict[str, float]:
    """``{"client": per call, "server": per call (PostgreSQL, Redis)}`` of one section."""
    from durq.bench.isolation import Isolated

    urls = {"postgresql": POSTGRES_URL, "redis": "redis://127.0.0.1:6379/14"}
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="durq-cost-") as tmp:
        if broker == "memory":
            counted = run_client(python, "memory://", n, tmp, lib, section)
        else:
            isolated = Isolated.create(urls.get(broker))
            try:
                asyncio.run(isolated.prepare())
                counted = run_client(python, isolated.url, n, tmp, lib, section)
            finally:
                asyncio.run(isolated.cleanup())
        out["client"] = counted[section] / n
        if broker == "postgresql":
            isolated = Isolated.create(urls["postgresql"])
            try:
                asyncio.run(isolated.prepare())
                out["server"] = run_postgres_server(python, isolated.url, n, section)[section] / n
            finally:
                asyncio.run(isolated.cleanup())
        elif broker == "redis":
            out["server"] = run_redis_server(python, n, tmp, section)[section] / n
    return out


def measure(python: str, broker: str, n: int, lib: str, jobs: int) -> dict[str, dict[str, float]]:
    """``{"client": {section: per call}, "server": {...}}`` of one broker, ``jobs``
    sections at a time (a count does not depend on how fast its run went)."""
    sections = [f"enqueue {w}" for w in ENQUEUE_WAYS] + [f"claim {w}" for w in CLAIM_WAYS]
    with ThreadPoolExecutor(jobs) as pool:
        got = list(pool.map(lambda s: measure_section(python, broker, n, lib, s), sections))
    out: dict[str, dict[str, float]] = {}
    for section, sides in zip(sections, got, strict=True):
        for side, value in sides.items():
            out.setdefault(side, {})[section] = value
    return out


def report(figures: dict[str, dict[str, dict[str, float]]], n: int) -> None:
    """One markdown table: per broker and call, each way's counts and ratio to plain."""
    print(f"\nper call, {n} calls a section (callgrind); ratio to plain (fair: also to limited)\n")
    print("| broker | call | way | client | ratio | server | ratio |")
    print("|---|---|---|---:|---:|---:|---:|")
    for broker, sides in figures.items():
        for call, ways in (("enqueue", ENQUEUE_WAYS), ("claim", CLAIM_WAYS)):
            for way in ways:
                cells = []
                for side in ("client", "server"):
                    got = sides.get(side, {})
                    value, plain = got.get(f"{call} {way}"), got.get(f"{call} plain")
                    if value is None or not plain:
                        cells += ["-", "-"]
                        continue
                    unit = " µs CPU" if side == "server" and broker == "postgresql" else "k"
                    shown = value / 1000
                    ratio = f"{value / plain:.3f}"
                    limited = got.get(f"{call} limited")
                    if way == "fair" and limited:
                        ratio += f" ({value / limited:.3f})"
                    cells += [f"{shown:,.1f}{unit}", ratio]
                print(f"| {broker} | {call} | {way} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    global ROUNDS
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        workload(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="memory,sqlite,postgresql,redis")
    parser.add_argument("-n", type=int, default=300, help="calls per section")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every section")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--jobs", type=int, default=2, help="sections measured at a time")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    ROUNDS = args.rounds
    with tempfile.TemporaryDirectory(prefix="durq-marks-") as build:
        lib = f"{build}/marks.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", lib, str(MARKS)], check=True)
        figures = {}
        for broker in args.brokers.split(","):
            figures[broker] = measure(args.python, broker, args.n, lib, args.jobs)
            print(f"{broker}: {json.dumps(figures[broker])}", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    report(figures, args.n)


if __name__ == "__main__":
    main()
