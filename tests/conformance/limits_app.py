"""The app of the multi-process limit tests: handlers write an independent ledger.

``durq worker limits_app:app`` runs it (``DURQ_BROKER_URL``, ``DURQ_TEST_LEDGER``); so does
``python limits_app.py URL LEASE CONCURRENCY`` (the same worker with a short lease, for the
short test). Each attempt appends ``start|end KEY ID TIME PID`` to the ledger file with one
``O_APPEND`` write, so lines of concurrent processes never mix; the broker is not asked."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import durq

QUEUE = "limits"
app = durq.App(sys.argv[1] if __name__ == "__main__" else None)


def _log(kind: str, key: str, task_id: str) -> None:
    line = f"{kind} {key} {task_id} {time.time():.6f} {os.getpid()}\n".encode()
    fd = os.open(os.environ["DURQ_TEST_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@app.task("limits:call", queue=QUEUE, limit=durq.Limit("partner:{partner}", concurrency=3))
async def call(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
    key = f"partner:{payload['partner']}"
    _log("start", key, ctx.id)
    await asyncio.sleep(float(payload.get("seconds", 0.02)))
    _log("end", key, ctx.id)


@app.task("limits:rated", queue=QUEUE, limit=durq.Limit("api", rate="20/s"))
async def rated(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
    _log("start", "api", ctx.id)
    _log("end", "api", ctx.id)


@dataclass
class Ledger:
    """What the handlers wrote: ``(kind, key, id, time, pid)`` per line."""

    lines: list[tuple[str, str, str, float, int]]

    @classmethod
    def read(cls, path: Path) -> Ledger:
        lines = []
        if path.exists():
            for raw in path.read_text().splitlines():
                if len(raw.split()) != 5:
                    continue  # a line a worker process is still writing
                kind, key, task_id, at, pid = raw.split()
                lines.append((kind, key, task_id, float(at), int(pid)))
        return cls(lines)

    def started(self, key_prefix: str = "") -> set[str]:
        return {i for k, key, i, _, _ in self.lines if k == "start" and key.startswith(key_prefix)}

    def ended(self, key_prefix: str = "") -> set[str]:
        return {i for k, key, i, _, _ in self.lines if k == "end" and key.startswith(key_prefix)}

    def peak_overlap(self) -> dict[str, int]:
        """Per key, the most attempts between their start and end line at one moment.

        An attempt that never ended (its process was killed) counts until the end."""
        events: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for kind, key, _, at, _ in self.lines:
            # At one instant an end is counted before a start.
            events[key].append((at, 1 if kind == "start" else -1))
        peak: dict[str, int] = {}
        for key, evs in events.items():
            running = top = 0
            for _, delta in sorted(evs):
                running += delta
                top = max(top, running)
            peak[key] = top
        return peak

    def starts(self, key: str) -> list[float]:
        return sorted(at for kind, k, _, at, _ in self.lines if kind == "start" and k == key)


if __name__ == "__main__":
    lease, concurrency = float(sys.argv[2]), int(sys.argv[3])
    worker = app.worker(
        queues=[QUEUE],
        concurrency=concurrency,
        lease_seconds=lease,
        rescue_interval=0.3,
        poll_interval=1.0,
        shutdown_timeout=1.0,
    )
    asyncio.run(worker.run())
