"""CPU time per task of the shipped ``durq worker`` and of a producer, per broker.

Throughput swings with whatever else the machine runs; the CPU time a process itself used
(user + system, from the kernel's accounting when it exits) swings much less, so this is the
figure to compare two builds of durq on a busy machine, and how the cost of a small code path
is judged. The broker server's own work is not in it.

For each broker, the worker drains N1 and then N2 no-op tasks, each in a new ``durq worker``
process stopped by SIGTERM once the last handler has run; the per-task figure is the
difference of the two counts over N2 - N1, so start-up and shutdown cancel out. The
producer is measured the same way (``app.enqueue`` one by one, and ``enqueue_many``).

``--pickups K1,K2`` adds the worker's CPU per task that reaches it alone: an idle worker
(started, one task run) is sent K1 and then K2 tasks at ``--rate`` per second, each in a new
process, and the difference is taken over K2 - K1 as above. That is the cost of picking up
each task as it comes (wake-up, claim, ack, and the idle wait between), which a drain of a
backlog shares out over batches. Beside it, the worker's voluntary context switches per such
task: each is one of its threads going to sleep (a hand-off between threads costs two).

    .venv/bin/python benchmarks/cpu_per_task.py [--brokers sqlite,redis,postgresql]
        [--pickups 100,400 --rate 100] [--worker-only]

``--worker-only`` measures the worker's drain alone: run it from two trees in turn, several
times, to compare two builds on a busy machine (alternate them; take the medians).

Storage is private to this tool: Redis database 5 (``BENCH_REDIS_URL``, keys ``durq-cpu*``
removed before each run), the PostgreSQL database ``durq_cpu`` (created again per run,
dropped at the end) and a temporary SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This directory is on sys.path when run as a script.
from compare import dropped_at_the_end
from run import recreate_pg_database

import durq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
#: This tool's own database, created again per run and dropped at the end.
PG_DB = "durq_cpu"
PG_DSN = f"postgresql://postgres@127.0.0.1:5432/{PG_DB}"
MARKS = os.environ.get("BENCH_MARKS", "")

app = durq.App(os.environ.get("DURQ_BROKER_URL", "memory://"))


@app.task("noop", retention=0)
async def noop(payload: dict[str, Any]) -> None:
    # One byte per completion, unbuffered: the driver watches the file's size.
    with open(MARKS, "ab", buffering=0) as f:
        f.write(b".")


def broker_url(broker: str, tmp: str) -> str:
    if broker == "sqlite":
        return f"sqlite:///{tmp}/cpu.sqlite3"
    if broker == "redis":
        return f"{REDIS_URL}?prefix=durq-cpu"
    return f"{PG_DSN}"


async def _reset(url: str) -> None:
    target = durq.App(url)
    broker: Any = target.new_broker()
    await broker.migrate()
    await broker.close()
    await target.close()


def reset(broker: str, url: str, tmp: str) -> None:
    if broker == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{tmp}/cpu.sqlite3{suffix}").unlink(missing_ok=True)
    elif broker == "redis":
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter("durq-cpu*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    else:
        recreate_pg_database(name=PG_DB)
    asyncio.run(_reset(url))


def run(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def usage_of(proc: subprocess.Popen[bytes]) -> Any:
    """Wait for the process; its resource usage (``resource.struct_rusage``)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, -signal.SIGTERM):
        raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
    return usage


def cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """Wait for the process; the user + system CPU seconds it used."""
    usage = usage_of(proc)
    return float(usage.ru_utime + usage.ru_stime)


def produce(url: str, n: int, mode: str, rate: float = 0.0) -> float:
    """CPU seconds of a process that enqueues ``n`` tasks: in batches of 500 (``many``) or
    one by one (``one``), at ``rate`` per second when given."""
    env = {**os.environ, "DURQ_BROKER_URL": url}
    code = (
        "import asyncio, time, cpu_per_task as m\n"
        "async def main():\n"
        f"    if {mode!r} == 'many':\n"
        "        for i in range(0, N, 500):\n"
        "            await m.app.enqueue_many([m.durq.EnqueueRequest('noop', {'i': j}) "
        "for j in range(i, min(N, i + 500))])\n"
        "    else:\n"
        "        started = time.perf_counter()\n"
        "        for i in range(N):\n"
        "            if RATE:\n"
        "                await asyncio.sleep(max(0, started + i / RATE - time.perf_counter()))\n"
        "            await m.app.enqueue('noop', {'i': i})\n"
        "    await m.app.close()\n"
        f"N, RATE = {n}, {rate}\n"
        "asyncio.run(main())\n"
    )
    return cpu_seconds(run([sys.executable, "-c", code], env))


def _worker(url: str, tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    """A ``durq worker`` process and the file its handlers mark."""
    marks = f"{tmp}/marks"
    Path(marks).write_bytes(b"")
    env = {**os.environ, "DURQ_BROKER_URL": url, "BENCH_MARKS": marks}
    return run([str(BIN / "durq"), "worker", "cpu_per_task:app"], env), marks


def _until_marked(proc: subprocess.Popen[bytes], marks: str, n: int) -> None:
    deadline = time.monotonic() + 600
    while os.path.getsize(marks) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker stopped after {os.path.getsize(marks)} of {n} tasks")
        time.sleep(0.05)


def drain(url: str, n: int, tmp: str) -> float:
    proc, marks = _worker(url, tmp)
    _until_marked(proc, marks, n)
    proc.send_signal(signal.SIGTERM)  # the worker finishes what it holds and exits
    return cpu_seconds(proc)


def pick_up(url: str, n: int, rate: float, tmp: str) -> tuple[float, int]:
    """CPU seconds and voluntary context switches (each a sleep of one of its threads) of a
    worker that is sent one task, then ``n`` more at ``rate``/s."""
    proc, marks = _worker(url, tmp)
    produce(url, 1, "one")
    _until_marked(proc, marks, 1)  # started and idle
    produce(url, n, "one", rate)
    _until_marked(proc, marks, n + 1)
    proc.send_signal(signal.SIGTERM)
    usage = usage_of(proc)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw


def measure(
    broker: str,
    n1: int,
    n2: int,
    repeats: int,
    pickups: tuple[int, int] | None,
    rate: float,
    worker_only: bool = False,
) -> dict[str, float]:
    """Median over ``repeats`` of the CPU microseconds per task of each step (``worker_only``:
    the worker's drain alone)."""
    samples: dict[str, list[float]] = {"worker": []}
    if not worker_only:
        samples.update(enqueue_one=[], enqueue_many=[])
    if pickups:
        samples["worker_alone"] = []
        samples["switches_alone"] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = broker_url(broker, tmp)
        for _ in range(repeats):
            for mode in () if worker_only else ("one", "many"):
                used = []
                for n in (n1, n2):
                    reset(broker, url, tmp)
                    used.append(produce(url, n, mode))
                samples[f"enqueue_{mode}"].append((used[1] - used[0]) / (n2 - n1) * 1e6)
            used = []
            for n in (n1, n2):
                reset(broker, url, tmp)
                produce(url, n, "many")
                used.append(drain(url, n, tmp))
            samples["worker"].append((used[1] - used[0]) / (n2 - n1) * 1e6)
            if pickups:
                runs = []
                for n in pickups:
                    reset(broker, url, tmp)
                    runs.append(pick_up(url, n, rate, tmp))
                (cpu1, sw1), (cpu2, sw2) = runs
                extra = pickups[1] - pickups[0]
                samples["worker_alone"].append((cpu2 - cpu1) / extra * 1e6)
                samples["switches_alone"].append((sw2 - sw1) / extra)
    return {step: statistics.median(values) for step, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="sqlite,redis,postgresql")
    parser.add_argument("--n1", type=int, default=1000)
    parser.add_argument("--n2", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pickups", help="K1,K2: also the worker's CPU per task sent alone")
    parser.add_argument("--rate", type=float, default=100.0, help="tasks/s for --pickups")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--worker-only", action="store_true", help="measure the worker's drain alone"
    )
    args = parser.parse_args()
    pickups = None
    if args.pickups:
        k1, k2 = (int(x) for x in args.pickups.split(","))
        pickups = (k1, k2)
    sys.path.insert(0, str(HERE))
    with dropped_at_the_end(args.brokers, PG_DB):
        results = {
            b: measure(b, args.n1, args.n2, args.repeats, pickups, args.rate, args.worker_only)
            for b in args.brokers.split(",")
        }
    if args.json:
        print(json.dumps(results))
        return
    print(f"CPU microseconds per task (user + system, median of {args.repeats}):")
    alone = f"{'worker, alone':>15}{'switches, alone':>17}" if pickups else ""
    print(f"{'broker':<12}{'enqueue':>10}{'enqueue_many':>14}{'worker':>10}{alone}")
    for broker, f in results.items():
        line = f"{broker:<12}{f.get('enqueue_one', math.nan):>10.1f}"
        line += f"{f.get('enqueue_many', math.nan):>14.1f}"
        line += f"{f['worker']:>10.1f}"
        if pickups:
            line += f"{f['worker_alone']:>15.1f}{f['switches_alone']:>17.1f}"
        print(line)


if __name__ == "__main__":
    main()
