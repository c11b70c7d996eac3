"""The bench worker process: ``python -m durq.bench worker --broker URL ...``.

A real :class:`~durq.worker.server.Worker` in its own process, driven over pipes by the
bench: it prints ``{"event": "ready"}`` once imported and connected, starts taking tasks when
it reads ``go`` on stdin, reports progress and the moments the processing and latency phases
finish (one JSON object per line on stdout), and stops gracefully on ``stop`` or end of input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from durq.bench.tasks import LATENCY, LATENCY_QUEUE, NOOP, PROCESS_QUEUE, build_app
from durq.brokers import open_broker
from durq.task import TaskInfo
from durq.worker.hooks import WorkerHooks


def emit(event: str, **fields: Any) -> None:
    """One event line for the parent."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class Counter(WorkerHooks):
    """Counts finished attempts per task type; announces when each phase is done.

    It runs after the broker has acknowledged the outcome, so "drained" means the broker
    holds every completion (the parent still checks the counts from the broker)."""

    def __init__(self, process: int, latency: int, progress_every: int) -> None:
        self.expected = {NOOP: process, LATENCY: latency}
        self.done = {NOOP: 0, LATENCY: 0}
        self.progress_every = max(1, progress_every)
        self.first_start: float | None = None

    def task_started(self, task: TaskInfo) -> None:
        if self.first_start is None and task.type == NOOP:
            self.first_start = time.time()

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        if outcome != "completed":
            emit("failed", type=task.type, id=task.id, outcome=outcome)
            return
        kind = task.type
        if kind not in self.done:
            return
        self.done[kind] += 1
        n = self.done[kind]
        if kind == NOOP and n % self.progress_every == 0:
            emit("progress", n=n)
        if n == self.expected[kind]:
            emit("drained" if kind == NOOP else "latency_done", n=n, t=time.time())


async def serve(args: argparse.Namespace) -> None:
    broker = open_broker(args.broker)
    await broker.connect()  # connected before "go", so start-up is not timed
    app = build_app(broker)
    hooks = Counter(args.process, args.latency, args.progress_every)
    worker = app.worker(
        queues={PROCESS_QUEUE: 1, LATENCY_QUEUE: 1},
        concurrency=args.concurrency,
        hooks=[hooks],
        scheduler=False,
        shutdown_timeout=5.0,
    )
    loop = asyncio.get_running_loop()
    emit("ready")
    try:
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "go":
                await worker.start()
                emit("started", t=time.time())
            elif line in ("stop", ""):
                break
    finally:
        await worker.stop()
        await broker.close()
    emit("stopped")


def main(argv: list[str] | None = None) -> None:
    """Parse the options and serve until told to stop."""
    parser = argparse.ArgumentParser(prog="python -m durq.bench worker")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--process", type=int, default=0, help="no-op tasks to expect")
    parser.add_argument("--latency", type=int, default=0, help="latency probes to expect")
    parser.add_argument("--progress-every", type=int, default=1000)
    args = parser.parse_args(argv)
    # Per-task INFO lines would measure the log handler; warnings and errors still show.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(serve(args))
