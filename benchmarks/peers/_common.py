"""Shared machinery of the peer drivers (runs inside a peer's virtual environment).

A driver module defines a ``Driver`` subclass: how to enqueue one task and (when the library
offers it) many in one call, how to reset its storage, and the command that starts ONE worker
process of the library with its usual layout. This module runs the workloads the same way for
every peer and prints one JSON object:

1. enqueue N no-op tasks one by one (timed), then reset the storage;
2. enqueue N no-op tasks in bulk (timed, when supported; else one by one, untimed);
3. enqueue N no-op tasks from 50 concurrent callers (coroutines on one event loop for async
   clients, threads for blocking ones: how a web server calls it), then reset;
4. start the worker; time from the worker command's launch to the N-th handler completion,
   start-up included, the same clock for every system (handlers append one byte to a
   per-process file, which the driver watches); the rate from the first completion is kept
   too (``process_from_first_per_s``);
5. with the worker idle, enqueue M probes at a fixed rate, each carrying ``time.time()``; the
   handler appends ``now - t`` to a per-process file: pickup latency enqueue -> handler start.

``--enqueue-only`` stops after step 3 (the enqueue figures alone).

Redis peers use database 5 of the local server (flushed before and after); PostgreSQL peers
use the database ``durq_bench`` (dropped and created again by the harness before each peer).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/durq_bench")
SIGNAL_DIR = os.environ.get("BENCH_SIGNAL_DIR", "/tmp/durq-bench-signals")
HERE = Path(__file__).resolve().parent

_files: dict[str, Any] = {}


def _file(kind: str) -> Any:
    # One unbuffered O_APPEND file per process: a write is one syscall, no lock, no broker.
    key = f"{kind}-{os.getpid()}"
    f = _files.get(key)
    if f is None:
        f = _files[key] = open(os.path.join(SIGNAL_DIR, f"{key}.txt"), "ab", buffering=0)
    return f


def mark() -> None:
    """Called by a no-op handler: one more task processed."""
    _file("done").write(b".")


def mark_latency(payload: dict[str, Any]) -> None:
    """Called by a latency probe handler: record enqueue -> start."""
    _file("lat").write(f"{time.time() - float(payload['t']):.6f}\n".encode())


def _done_count() -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(SIGNAL_DIR, "done-*.txt")))


def _latencies() -> list[float]:
    values: list[float] = []
    for path in glob.glob(os.path.join(SIGNAL_DIR, "lat-*.txt")):
        with open(path) as f:
            values.extend(float(line) for line in f if line.strip())
    return values


def _lat_count() -> int:
    count = 0
    for path in glob.glob(os.path.join(SIGNAL_DIR, "lat-*.txt")):
        with open(path, "rb") as f:
            count += f.read().count(b"\n")
    return count


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values), max(1, math.ceil(p / 100 * len(values)))) - 1]


def reset_redis() -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    client.close()


def reset_signals() -> None:
    os.makedirs(SIGNAL_DIR, exist_ok=True)
    for path in glob.glob(os.path.join(SIGNAL_DIR, "*.txt")):
        os.remove(path)


class Driver:
    """Override what the library needs; see the module docstring."""

    system = "?"
    broker = "redis"
    layout = "?"
    #: False when the library has no bulk enqueue (the table shows a dash).
    has_bulk = False
    #: How 50 concurrent callers share the client: "async" (coroutines on one loop),
    #: "threads" (a blocking client), or "" (the client cannot be shared: a dash).
    concurrent_callers = "threads"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    async def open(self) -> None:
        """Connect the producer."""

    async def close(self) -> None:
        """Disconnect the producer."""

    async def reset(self) -> None:
        """Empty the storage (and create the library's schema when it has one)."""
        if self.broker == "redis":
            reset_redis()
        else:
            await self.reset_postgres()

    async def reset_postgres(self) -> None:
        """Drop everything in ``durq_bench`` and install the library's schema."""
        import psycopg

        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
            await conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
            await conn.execute("CREATE SCHEMA public")
        await self.install_schema()

    async def install_schema(self) -> None:
        """Create the library's tables (PostgreSQL peers)."""

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        raise NotImplementedError

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def worker_command(self) -> list[str]:
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return {}


async def _wait(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[bytes]) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise RuntimeError(
                f"worker exited with code {proc.returncode} while waiting for {what}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.002)
    return time.time()


async def _run(driver: Driver) -> dict[str, Any]:
    args = driver.args
    n, m = args.tasks, args.latency_tasks
    reset_signals()
    await driver.reset()
    await driver.open()
    result: dict[str, Any] = {
        "system": driver.system,
        "broker": driver.broker,
        "layout": driver.layout,
        "tasks": n,
    }
    try:
        started = time.perf_counter()
        for i in range(n):
            await driver.enqueue({"i": i})
        result["enqueue_per_s"] = round(n / (time.perf_counter() - started), 1)
        await driver.close()
        await driver.reset()
        await driver.open()
        if driver.has_bulk:
            started = time.perf_counter()
            for first in range(0, n, args.bulk_chunk):
                await driver.enqueue_many(
                    [{"i": i} for i in range(first, min(n, first + args.bulk_chunk))]
                )
            result["enqueue_bulk_per_s"] = round(n / (time.perf_counter() - started), 1)
        else:
            for i in range(n):
                await driver.enqueue({"i": i})
            result["enqueue_bulk_per_s"] = None
        if driver.concurrent_callers:
            await driver.close()
            await driver.reset()
            await driver.open()
            started = time.perf_counter()
            try:
                await _concurrent_enqueue(driver, n, CALLERS)
                result["enqueue_concurrent_per_s"] = round(n / (time.perf_counter() - started), 1)
            except Exception as exc:  # a client that cannot be shared: a dash, and why
                result["enqueue_concurrent_per_s"] = None
                result["enqueue_concurrent_error"] = f"{type(exc).__name__}: {exc}"[:200]
            if args.enqueue_only:
                return result
            await driver.close()
            await driver.reset()
            await driver.open()
            for first in range(0, n, args.bulk_chunk):  # the worker phase's N tasks again
                if driver.has_bulk:
                    await driver.enqueue_many(
                        [{"i": i} for i in range(first, min(n, first + args.bulk_chunk))]
                    )
                else:
                    for i in range(first, min(n, first + args.bulk_chunk)):
                        await driver.enqueue({"i": i})
        else:
            result["enqueue_concurrent_per_s"] = None
        if args.enqueue_only:
            return result
        log = open(os.path.join(SIGNAL_DIR, "worker.log"), "wb")
        # The driver's own PYTHONPATH stays in front: a build given to compare.py as a wrapper
        # that sets it (PYTHONPATH=/tmp/old/src) must run its worker on that build too, not
        # on whatever durq the interpreter's environment has installed.
        path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(HERE)]))
        env = {**os.environ, "PYTHONPATH": path, **driver.worker_env()}
        cpu_before = _children_cpu()
        launched = time.time()
        proc = subprocess.Popen(
            driver.worker_command(),
            cwd=HERE,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            timeout = max(300.0, n / 20)
            t_first = await _wait(lambda: _done_count() > 0, 60, "the first task", proc)
            t_last = await _wait(lambda: _done_count() >= n, timeout, f"{n} tasks", proc)
            result["process_per_s"] = round(n / max(t_last - launched, 1e-9), 1)
            result["process_from_first_per_s"] = round((n - 1) / max(t_last - t_first, 1e-9), 1)
            if m:
                await asyncio.sleep(1.0)  # the worker is idle now
                interval = 1.0 / args.latency_rate
                started = time.perf_counter()
                for i in range(m):
                    delay = started + i * interval - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await driver.enqueue({"t": time.time()}, latency=True)
                await _wait(lambda: _lat_count() >= m, m * interval + 60, "latency probes", proc)
                values = [v * 1000 for v in _latencies()]
                result["latency_ms"] = {
                    "p50": round(percentile(values, 50), 3),
                    "p95": round(percentile(values, 95), 3),
                    "p99": round(percentile(values, 99), 3),
                    "max": round(max(values), 3),
                }
        finally:
            _stop(proc)
            log.close()
        # CPU seconds of the worker (and its children) over its whole life: a figure the
        # machine's other load disturbs much less than a rate does.
        result["worker_cpu_s"] = round(_children_cpu() - cpu_before, 3)
    finally:
        await driver.close()
        try:
            await driver.reset()
        except Exception:  # cleanup is best effort; the harness resets again
            pass
    return result


CALLERS = 50


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _concurrent_enqueue(driver: Driver, n: int, callers: int) -> None:
    """``n`` enqueues shared by ``callers`` concurrent callers of one process."""
    shares = [range(c, n, callers) for c in range(callers)]

    async def caller(share: range) -> None:
        for i in share:
            await driver.enqueue({"i": i})

    if driver.concurrent_callers == "async":
        await asyncio.gather(*(caller(s) for s in shares))
        return
    # A blocking client: one thread per caller, like a threaded WSGI server.
    await asyncio.gather(*(asyncio.to_thread(asyncio.run, caller(s)) for s in shares))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    # Children a library forked into a new group of their own would survive; kill stragglers.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    """``python _common.py bench_<peer> [options]``: run the workloads, print one JSON object.

    The driver module is imported by name (not run as ``__main__``) so the worker process,
    which imports the same module, registers the tasks under the same names."""
    import importlib

    parser = argparse.ArgumentParser()
    parser.add_argument("driver", help="driver module, e.g. bench_huey")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--latency-tasks", type=int, default=1_000)
    parser.add_argument("--latency-rate", type=float, default=100.0)
    parser.add_argument("--bulk-chunk", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--enqueue-only", action="store_true", help="skip the worker phases")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    driver_class: type[Driver] = importlib.import_module(args.driver).DRIVER
    result = asyncio.run(_run(driver_class(args)))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()


# -- the handler ledger of benchmarks/limits.py and benchmarks/durable.py ------------------

#: Bytes of one handler's line: the parent counts them by file size.
LINE = 49


def record(kind: str, start: float) -> None:
    """One line of LINE bytes per handler: its start, its end, and the worker process's CPU
    seconds so far (every thread; one ``getrusage`` and one ``write`` call)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    _file(kind).write(f"{start:17.6f} {time.time():17.6f} {cpu:12.6f}\n".encode())


def note(kind: str, start: float, workflow: int) -> None:
    """A line of LINE bytes for a task of workflow number ``workflow`` (benchmarks/workflows.py):
    its start, its end, and that number where :func:`record` puts the CPU seconds."""
    _file(kind).write(f"{start:17.6f} {time.time():17.6f} {workflow:12d}\n".encode())


def durq_worker(
    app_path: str, url: str, signals: str, log: Any, *args: str
) -> subprocess.Popen[bytes]:
    """``durq worker APP ARGS`` of this interpreter's environment (the shipped command),
    started in ``benchmarks/`` on broker ``url``, its handlers writing to ``signals``, its
    output to the open file ``log``, in a session of its own (see :func:`_stop`)."""
    env = {**os.environ, "DURQ_BROKER_URL": url, "BENCH_SIGNAL_DIR": signals}
    command = [str(Path(sys.executable).parent / "durq"), "worker", app_path, *args]
    return subprocess.Popen(
        command, cwd=HERE.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def text_table(head: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    """``head`` and ``body`` as aligned text columns, a rule under the head."""
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    out = [
        " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [head, *body]
    ]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return out


def ended(signals: str, kind: str) -> int:
    """How many ``kind`` handlers have ended (cheap enough to poll every few ms)."""
    paths = glob.glob(os.path.join(signals, f"{kind}-*.txt"))
    return sum(os.path.getsize(path) // LINE for path in paths)


def lines(signals: str, kind: str) -> list[tuple[float, float, float]]:
    """The complete lines of every worker process's ``kind`` file, in order of start."""
    rows = []
    for path in glob.glob(os.path.join(signals, f"{kind}-*.txt")):
        with open(path, "rb") as f:
            for line in f.read().split(b"\n")[:-1]:  # the last piece is empty or still written
                start, end, cpu = line.split()
                rows.append((float(start), float(end), float(cpu)))
    return sorted(rows)
