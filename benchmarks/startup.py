"""How long ``durq worker`` takes from its launch to its first handler, per broker and build.

Tasks are enqueued before the worker starts; the handler of each appends one byte to a
file, which this tool watches. The clock runs from the worker's launch (``Popen``) to the
first byte, the moment ``make bench``'s clock first sees a completion; the worker is then
killed and its CPU time (user + system, from ``wait4``) is the CPU its start-up took, a
figure the machine's other load disturbs less than the wall clock. Builds alternate run by
run (A, B, B, A, ...) as in ``compare.py``; each build is a Python interpreter whose
environment has that build of durq (a wrapper script that sets ``PYTHONPATH`` to another
source tree works too). The worker runs as ``python -m durq worker``, which imports what
the ``durq`` script imports.

Storage is private to this tool: Redis database ``--redis-db`` (flushed before each run),
the PostgreSQL database ``durq_startup`` (created again per run, dropped at the end) and a
temporary SQLite file.

    .venv/bin/python benchmarks/startup.py --build before=/tmp/old/.venv/bin/python \\
        --build after=.venv/bin/python [--brokers sqlite,redis,postgresql] [--runs 10]
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

# This directory is on sys.path when run as a script.
from compare import (
    alternating,
    builds_parser,
    dropped_at_the_end,
    parse_builds,
    private_storage,
    reset_storage,
)

PG_DB = "durq_startup"

APP = """
import os

import durq

app = durq.App(os.environ["DURQ_BROKER_URL"])


@app.task("startup:touch", retention=0)
async def touch(payload: dict) -> None:
    with open(os.environ["STARTUP_OUT"], "ab", buffering=0) as f:
        f.write(b".")
"""

#: Run by the build's interpreter before each launch: a fresh schema and a few tasks.
PREPARE = """
import asyncio

from startup_app import app


async def main() -> None:
    broker = app.new_broker()
    await broker.migrate()
    await broker.close()
    for i in range(20):
        await app.enqueue("startup:touch", {"i": i})
    await app.close()


asyncio.run(main())
"""


def launch_once(python: str, broker: str, url: str, workdir: Path) -> tuple[float, float]:
    """Seconds from launch to the first handler, and the CPU seconds the worker used."""
    reset_storage(broker, url, sqlite_file=workdir / "store.sqlite3", pg_db=PG_DB)
    out = workdir / "out.txt"
    out.unlink(missing_ok=True)
    env = {**os.environ, "DURQ_BROKER_URL": url, "STARTUP_OUT": str(out)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(workdir)]))
    subprocess.run([python, "-c", PREPARE], cwd=workdir, env=env, check=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-m", "durq", "worker", "startup_app:app"],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while not (out.exists() and out.stat().st_size > 0):
        if proc.poll() is not None:
            raise RuntimeError(f"{python}: durq worker exited with {proc.returncode}")
        time.sleep(0.0005)
    elapsed = time.perf_counter() - started
    os.kill(proc.pid, signal.SIGKILL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = -signal.SIGKILL  # reaped above
    return elapsed, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = builds_parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="launches per build and broker")
    parser.add_argument("--redis-db", type=int, default=12)
    args = parser.parse_args()
    builds = parse_builds(parser, args)
    workdir, urls = private_storage("durq-startup-", redis_db=args.redis_db, pg_db=PG_DB)
    (workdir / "startup_app.py").write_text(APP)
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    print("| broker | build | launch → first handler, median (min) ms | start-up CPU, median ms |")
    print("|---|---|---:|---:|")
    with dropped_at_the_end(args.brokers, PG_DB):
        for broker in args.brokers.split(","):
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in builds}
            for _, name, python in alternating(builds, args.runs):
                runs[name].append(launch_once(python, broker, urls[broker], workdir))
            for name, _ in builds:
                walls = [w for w, _ in runs[name]]
                cpus = [c for _, c in runs[name]]
                print(
                    f"| {broker} | {name} | {1000 * statistics.median(walls):.0f} "
                    f"({1000 * min(walls):.0f}) | {1000 * statistics.median(cpus):.0f} |"
                )


if __name__ == "__main__":
    main()
