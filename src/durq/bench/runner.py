"""The measurements of ``durq bench``: enqueue rates, processing rate, pickup latency.

Phases, one after another on one isolated broker (see :mod:`durq.bench.isolation`):

1. **enqueue**: N tasks, one ``App.enqueue`` call each, from this process.
2. **enqueue bulk**: N tasks with ``App.enqueue_many`` in chunks (E9).
3. **process**: one worker process (``python -m durq.bench worker``) at the given concurrency
   drains those N tasks; the clock runs from "go" to the last acknowledged completion, and the
   count is then checked from the broker (processed total, nothing pending or active).
4. **latency**: M probes enqueued at a fixed rate into the now idle worker; each handler
   returns enqueue → start in seconds, read back from the broker as task results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from durq.app import App
from durq.bench.isolation import Isolated
from durq.bench.tasks import (
    ENQUEUE_QUEUE,
    LATENCY,
    LATENCY_QUEUE,
    LOCAL_LATENCY,
    LOCAL_LATENCY_QUEUE,
    NOOP,
    PROCESS_QUEUE,
    build_app,
)
from durq.errors import DurqError
from durq.options import EnqueueRequest
from durq.states import TaskState
from durq.urls import redact


class BenchError(DurqError):
    """The benchmark could not complete."""


@dataclass(frozen=True)
class BenchOptions:
    """What to measure, and where."""

    tasks: int = 20_000
    concurrency: int = 100
    #: Broker URL; ``None`` means a temporary SQLite file.
    broker: str | None = None
    latency_tasks: int = 1_000
    #: Probes per second in the latency phase.
    latency_rate: float = 100.0
    bulk_chunk: int = 1_000
    #: Show a progress bar on stderr.
    progress: bool = True


def machine() -> dict[str, Any]:
    """The machine the figures come from."""
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max/mean in milliseconds."""
    values = sorted(s * 1000 for s in seconds)
    mean = sum(values) / len(values) if values else 0.0
    return {
        "p50": round(percentile(values, 50), 3),
        "p95": round(percentile(values, 95), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(values[-1], 3) if values else 0.0,
        "mean": round(mean, 3),
    }


class WorkerProcess:
    """The bench worker subprocess and its event stream."""

    def __init__(self, proc: asyncio.subprocess.Process, on_progress: Any) -> None:
        self.proc = proc
        self.failed = 0
        self._on_progress = on_progress

    @classmethod
    @contextlib.asynccontextmanager
    async def spawn(
        cls, url: str, options: BenchOptions, on_progress: Any
    ) -> AsyncIterator[WorkerProcess]:
        """Start the worker process and wait until it is ready; stop it on exit."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "durq.bench",
            "worker",
            "--broker",
            url,
            "--concurrency",
            str(options.concurrency),
            "--process",
            str(options.tasks),
            "--latency",
            str(options.latency_tasks),
            "--progress-every",
            str(max(1, options.tasks // 100)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = cls(proc, on_progress)
        try:
            await worker.wait_for("ready", 60)
            yield worker
        finally:
            await worker.stop()

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def wait_for(self, event: str, timeout: float) -> dict[str, Any]:
        """The next ``event`` line; progress and failures are handled on the way."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"the bench worker did not report {event!r} in {timeout:g}s")
            try:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            except TimeoutError:
                continue
            if not raw:
                code = await self.proc.wait()
                raise BenchError(f"the bench worker exited (code {code}) before {event!r}")
            try:
                message: dict[str, Any] = json.loads(raw)
            except ValueError:
                continue  # not ours (a library printing to stdout)
            name = message.get("event")
            if name == event:
                return message
            if name == "progress":
                self._on_progress(int(message["n"]))
            elif name == "failed":
                self.failed += 1

    async def stop(self) -> None:
        if self.proc.returncode is not None:
            return
        with contextlib.suppress(Exception):
            await self.send("stop")
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


class _Bar:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, enabled: bool) -> None:
        self.progress: Progress | None = None
        if enabled:
            self.progress = Progress(
                TextColumn("[bold]{task.description:<14}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
        self._task: Any = None

    @contextlib.contextmanager
    def running(self) -> Iterator[_Bar]:
        if self.progress is None:
            yield self
            return
        with self.progress:
            yield self

    def phase(self, name: str, total: int) -> None:
        if self.progress is not None:
            self._task = self.progress.add_task(name, total=total)

    def update(self, completed: int) -> None:
        if self.progress is not None and self._task is not None:
            self.progress.update(self._task, completed=completed)


async def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run every phase on an isolated broker and return the figures (see module docstring)."""
    if options.tasks < 1 or options.concurrency < 1 or options.latency_tasks < 0:
        raise BenchError("--tasks and --concurrency must be >= 1, --latency-tasks >= 0")
    isolated = Isolated.create(options.broker)
    bar = _Bar(options.progress)
    try:
        await isolated.prepare()
        with bar.running():
            result = await _measure(isolated, options, bar)
    finally:
        await isolated.cleanup()
    return result


async def _measure(isolated: Isolated, options: BenchOptions, bar: _Bar) -> dict[str, Any]:
    n = options.tasks
    app = build_app(isolated.url)
    try:
        async with WorkerProcess.spawn(isolated.url, options, bar.update) as worker:
            enqueue_s = await _enqueue_one_by_one(app, n, bar)
            bulk_s = await _enqueue_bulk(app, n, options.bulk_chunk, bar)
            process_s = await _process(app, worker, n, bar)
            latencies = await _latency(app, worker, options, bar)
            failed = worker.failed
        local = await _latency_in_process(app, options, bar)
    finally:
        await app.close()
    return {
        "broker": isolated.kind,
        "broker_url": redact(isolated.base) if isolated.base else "sqlite (temporary file)",
        #: The schema, key prefix or temporary directory used and removed by this run.
        "isolated": isolated.name,
        "tasks": n,
        "concurrency": options.concurrency,
        "enqueue_per_s": round(n / enqueue_s, 1),
        "enqueue_bulk_per_s": round(n / bulk_s, 1),
        "bulk_chunk": options.bulk_chunk,
        "process_per_s": round(n / process_s, 1),
        "processed_verified": n,
        "failed": failed,
        "latency_ms": latency_summary(latencies),
        #: The same probes into an idle worker running in the producer's process (monolith).
        "latency_in_process_ms": latency_summary(local),
        "latency_tasks": options.latency_tasks,
        "latency_rate": options.latency_rate,
        "seconds": {
            "enqueue": round(enqueue_s, 4),
            "enqueue_bulk": round(bulk_s, 4),
            "process": round(process_s, 4),
        },
        "machine": machine(),
        "durq": _version(),
    }


def _version() -> str:
    from durq import __version__

    return __version__


async def _enqueue_one_by_one(app: App, n: int, bar: _Bar) -> float:
    bar.phase("enqueue", n)
    await app.broker()  # connect outside the clock
    step = max(1, n // 100)
    started = time.perf_counter()
    for i in range(n):
        await app.enqueue(NOOP, {"i": i}, queue=ENQUEUE_QUEUE)
        if i % step == 0:
            bar.update(i + 1)
    elapsed = time.perf_counter() - started
    bar.update(n)
    # These tasks were only for the enqueue figure; the count doubles as a check.
    deleted = await app.inspector.delete_all(ENQUEUE_QUEUE, TaskState.PENDING)
    if deleted != n:
        raise BenchError(f"enqueued {n} tasks one by one but the broker held {deleted}")
    return elapsed


async def _enqueue_bulk(app: App, n: int, chunk: int, bar: _Bar) -> float:
    bar.phase("enqueue bulk", n)
    chunk = max(1, chunk)
    created = 0
    started = time.perf_counter()
    for first in range(0, n, chunk):
        requests = [EnqueueRequest(NOOP, {"i": i}) for i in range(first, min(n, first + chunk))]
        outcomes = await app.enqueue_many(requests)
        created += sum(1 for o in outcomes if o.created)
        bar.update(first + len(requests))
    elapsed = time.perf_counter() - started
    stats = await app.inspector.queue_stats(PROCESS_QUEUE)
    pending = stats.sizes.get(TaskState.PENDING, 0)
    if created != n or pending != n:
        raise BenchError(f"bulk enqueue of {n} tasks: {created} created, {pending} pending")
    return elapsed


async def _process(app: App, worker: WorkerProcess, n: int, bar: _Bar) -> float:
    bar.phase("process", n)
    before = (await app.inspector.queue_stats(PROCESS_QUEUE)).processed_total
    started = time.time()
    await worker.send("go")
    drained = await worker.wait_for("drained", max(120.0, n / 50))
    elapsed = float(drained["t"]) - started
    bar.update(n)
    # Verified from the broker, not from the worker's own count.
    stats = await app.inspector.queue_stats(PROCESS_QUEUE)
    processed = stats.processed_total - before
    left = stats.sizes.get(TaskState.PENDING, 0) + stats.sizes.get(TaskState.ACTIVE, 0)
    if processed != n or left:
        raise BenchError(f"processing: the broker counts {processed} of {n} processed, {left} left")
    return elapsed


async def _latency(
    app: App, worker: WorkerProcess, options: BenchOptions, bar: _Bar
) -> list[float]:
    m = options.latency_tasks
    if m == 0:
        return []
    bar.phase("latency", m)
    await asyncio.sleep(0.3)  # let the worker go idle: it now waits for work
    await _send_probes(app, LATENCY, options, bar)
    interval = 1.0 / options.latency_rate
    await worker.wait_for("latency_done", m * interval + 60)
    return await _probe_results(app, LATENCY_QUEUE, m)


async def _send_probes(app: App, task_type: str, options: BenchOptions, bar: _Bar) -> None:
    interval = 1.0 / options.latency_rate
    started = time.perf_counter()
    for i in range(options.latency_tasks):
        delay = started + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await app.enqueue(task_type, {"t": time.time()})
        bar.update(i + 1)


async def _latency_in_process(app: App, options: BenchOptions, bar: _Bar) -> list[float]:
    """Pickup latency of a worker inside this process: the in-process wake-up path."""
    m = options.latency_tasks
    if m == 0:
        return []
    bar.phase("latency (in-process worker)", m)
    worker = app.worker(queues=[LOCAL_LATENCY_QUEUE], concurrency=options.concurrency)
    async with worker:
        await asyncio.sleep(0.3)  # idle: the fetcher waits for work
        await _send_probes(app, LOCAL_LATENCY, options, bar)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = await app.inspector.queue_stats(LOCAL_LATENCY_QUEUE)
            if stats.sizes.get(TaskState.COMPLETED, 0) >= m:
                break
            await asyncio.sleep(0.05)
    return await _probe_results(app, LOCAL_LATENCY_QUEUE, m)


async def _probe_results(app: App, queue: str, m: int) -> list[float]:
    values: list[float] = []
    offset = 0
    while True:
        page = await app.inspector.list_tasks(queue, TaskState.COMPLETED, limit=1000, offset=offset)
        values.extend(float(t.result["latency"]) for t in page)
        if len(page) < 1000:
            break
        offset += len(page)
    if len(values) != m:
        raise BenchError(f"latency: {m} probes sent, {len(values)} results in the broker")
    return values
