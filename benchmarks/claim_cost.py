"""The PostgreSQL server's CPU time per claim of an empty queue, per build.

What the claim statement itself costs the server, which latencies on a shared machine do
not tell apart.

For each run, the build's interpreter migrates a new database, sends ``--history`` no-op
tasks through the queue (enqueued in bulk, then claimed and completed by a broker as a
worker does, ten at a time), and then claims the empty queue ``--claims`` times on one pooled
connection. The figure is the CPU time the server's backends of that database used over
those claims (``/proc/<pid>/schedstat``, so the server must run on this machine), divided
by their number; beside it, the client process's CPU per claim. An empty claim runs the
whole statement (its checks, its index scan past the history's dead entries) but writes
nothing, so it is the statement's fixed cost on the server.

The claims are the broker's own calls from one process, not ``durq worker``'s: a figure to
compare builds' claim statements by, not what a worker's task costs (``compare.py`` and
``cpu_per_task.py`` measure the shipped worker).

Builds alternate run by run (A, B, B, A, ...) as in ``compare.py``; the table gives each
build's median over ``--rounds`` and its range. The database ``durq_claimcost`` is created
again per run and dropped at the end.

    .venv/bin/python benchmarks/claim_cost.py --build before=/tmp/old/py \\
        --build main=.venv/bin/python [--rounds 3] [--history 10000] [--claims 2000]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

# This directory is on sys.path when run as a script.
from compare import alternating, builds_parser, dropped_at_the_end, parse_builds
from run import recreate_pg_database

PG_DB = "durq_claimcost"
URL = f"postgresql://postgres@127.0.0.1:5432/{PG_DB}"

#: Run by the build's interpreter: the history, then the claims; one JSON line.
DRIVE = """
import asyncio
import json
import sys
import time

import psycopg

import durq
from durq.brokers.base import ClaimParams, CompleteParams
from durq.options import EnqueueRequest

URL = sys.argv[1]


def server_cpu_ns():
    with psycopg.connect(URL, autocommit=True) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ]
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


async def main(history, claims):
    app = durq.App(URL + "?pool_max=1")  # one connection: every claim on the same plan

    @app.task("bench:noop", retention=0)
    async def noop(payload):
        pass

    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    broker = app.new_broker()
    await broker.connect()
    for first in range(0, history, 1000):
        await app.enqueue_many(
            [EnqueueRequest("bench:noop", {}) for _ in range(min(1000, history - first))]
        )
    params = ClaimParams(["default"], 10, "bench", 30.0)
    while leases := await broker.claim(params):
        await broker.complete_many([CompleteParams(lease.ref) for lease in leases])
    for _ in range(20):  # prepared (at the fifth call) and planned before the count starts
        await broker.claim(params)
    server, client = server_cpu_ns(), time.process_time()
    for _ in range(claims):
        await broker.claim(params)
    server, client = server_cpu_ns() - server, time.process_time() - client
    await broker.close()
    await app.close()
    print(json.dumps({"server_us": server / claims / 1000, "client_us": client / claims * 1e6}))


asyncio.run(main(int(sys.argv[2]), int(sys.argv[3])))
"""


def run_once(python: str, history: int, claims: int) -> dict[str, float]:
    recreate_pg_database(name=PG_DB)
    out = subprocess.run(
        [python, "-c", DRIVE, URL, str(history), str(claims)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{python}: {out.stderr.strip().splitlines()[-3:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = builds_parser(__doc__.splitlines()[0], brokers=False)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=2_000)
    args = parser.parse_args()
    builds = parse_builds(parser, args)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in builds}
    with dropped_at_the_end("postgresql", PG_DB):
        for _, label, python in alternating(builds, args.rounds):
            runs[label].append(run_once(python, args.history, args.claims))
    print(
        f"{args.claims:,} claims of an empty queue after {args.history:,} tasks, "
        f"{args.rounds} runs a build; CPU µs per claim, median (range)\n"
    )
    print("| build | server | client | server / first |")
    print("|---|---:|---:|---:|")
    first = statistics.median(r["server_us"] for r in runs[builds[0][0]])
    for label, _ in builds:
        cells = []
        for key in ("server_us", "client_us"):
            values = [r[key] for r in runs[label]]
            cells.append(
                f"{statistics.median(values):.1f} ({min(values):.1f} to {max(values):.1f})"
            )
        ratio = statistics.median(r["server_us"] for r in runs[label]) / first
        print(f"| {label} | {cells[0]} | {cells[1]} | {ratio:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
