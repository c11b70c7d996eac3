"""Worker memory over a long run: is the worker's RSS flat across 1,000,000 processed tasks?

One bench worker process (``python -m durq.bench worker``, the worker ``durq bench`` times)
drains N no-op tasks on an isolated broker (a fresh PostgreSQL schema, Redis key prefix or
temporary SQLite file, removed at the end). A feeder in this process keeps the backlog between
``--backlog`` and twice that with ``enqueue_many``, so the queue never runs dry and never holds
all N tasks at once. The worker's resident set size is read from ``/proc/<pid>/status``
(VmRSS) at every progress report (every N/200 tasks).

Flat means: every sample after the warm-up (the first ``--warmup`` share of the tasks, when
caches, pools and prepared statements fill) lies within ±10% of the RSS at the end of the
warm-up. Completions are checked from the broker (processed total), as ``durq bench`` does.

    .venv/bin/python benchmarks/worker_rss.py --broker postgresql://postgres@127.0.0.1:5432/test
        [--tasks 1000000] [--concurrency 100] [--backlog 20000] [--warmup 0.1] [--json]

Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from durq.bench.isolation import Isolated
from durq.bench.tasks import NOOP, PROCESS_QUEUE, build_app
from durq.options import EnqueueRequest
from durq.states import TaskState
from durq.urls import redact

CHUNK = 1000


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    isolated = Isolated.create(args.broker)
    await isolated.prepare()
    app = build_app(isolated.url)
    samples: list[tuple[int, float, float]] = []  # (processed, seconds, rss MiB)
    try:
        await app.broker()
        enqueued = 0

        async def top_up(target: int) -> None:
            nonlocal enqueued
            while enqueued < min(args.tasks, target):
                n = min(CHUNK, args.tasks - enqueued)
                requests = [EnqueueRequest(NOOP, {"i": enqueued + i}) for i in range(n)]
                outcomes = await app.enqueue_many(requests)
                if not all(o.created for o in outcomes):
                    raise RuntimeError("an enqueue was refused")
                enqueued += n

        await top_up(2 * args.backlog)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "durq.bench", "worker", "--broker", isolated.url,
            "--concurrency", str(args.concurrency), "--process", str(args.tasks),
            "--progress-every", str(max(1, args.tasks // 200)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            while json.loads(await proc.stdout.readline() or b"{}").get("event") != "ready":
                if proc.returncode is not None:
                    raise RuntimeError("the bench worker exited before it was ready")
            started = time.perf_counter()
            samples.append((0, 0.0, rss_mb(proc.pid)))
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
            feeding: asyncio.Task[None] | None = None
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), 600)
                if not line:
                    raise RuntimeError("the bench worker exited early")
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "failed":
                        raise RuntimeError(f"a task failed: {event}")
                    if event.get("event") in ("progress", "drained"):
                        done = int(event["n"])
                        elapsed = time.perf_counter() - started
                        samples.append((done, elapsed, rss_mb(proc.pid)))
                        if not args.json:
                            print(f"{done:>9,} tasks  {elapsed:7.1f} s  {samples[-1][2]:7.1f} MiB")
                        if event["event"] == "drained":
                            break
                        # Keep the backlog up without waiting for the feeder here.
                        if enqueued - done < args.backlog and (feeding is None or feeding.done()):
                            if feeding is not None:
                                feeding.result()
                            feeding = asyncio.create_task(top_up(done + 2 * args.backlog))
            elapsed = time.perf_counter() - started
            if feeding is not None:
                await feeding
            proc.stdin.write(b"stop\n")
            await proc.stdin.drain()
            await asyncio.wait_for(proc.wait(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stats = await app.inspector.queue_stats(PROCESS_QUEUE)
        if stats.processed_total != args.tasks or stats.sizes.get(TaskState.PENDING, 0):
            raise RuntimeError(f"the broker counts {stats.processed_total} of {args.tasks}")
    finally:
        await app.close()
        await isolated.cleanup()
    warm = next(s for s in samples if s[0] >= args.warmup * args.tasks)
    after = [s for s in samples if s[0] >= warm[0]]
    low, high = min(s[2] for s in after), max(s[2] for s in after)
    return {
        "broker": isolated.kind,
        "broker_url": redact(isolated.base) if isolated.base else "sqlite (temporary file)",
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "process_per_s": round(args.tasks / elapsed, 1),
        "rss_mib": {
            "start": round(samples[0][2], 1),
            "after_warmup": round(warm[2], 1),
            "warmup_tasks": warm[0],
            "end": round(samples[-1][2], 1),
            "min_after_warmup": round(low, 1),
            "max_after_warmup": round(high, 1),
        },
        "max_deviation_after_warmup": round(
            max(abs(high - warm[2]), abs(low - warm[2])) / warm[2], 4
        ),
        "flat_within_10pct": max(abs(high - warm[2]), abs(low - warm[2])) <= 0.1 * warm[2],
        "samples": [
            {"processed": n, "seconds": round(t, 2), "rss_mib": round(r, 1)} for n, t, r in samples
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=None, help="broker URL (default: temporary SQLite)")
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--warmup", type=float, default=0.1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    rss = report["rss_mib"]
    print(
        f"{report['broker']}: {report['tasks']:,} tasks at {report['process_per_s']:,.0f}/s; "
        f"RSS start {rss['start']} MiB, after warm-up ({rss['warmup_tasks']:,} tasks) "
        f"{rss['after_warmup']} MiB, end {rss['end']} MiB, range after warm-up "
        f"{rss['min_after_warmup']}-{rss['max_after_warmup']} MiB "
        f"(max deviation {100 * report['max_deviation_after_warmup']:.1f}%, "
        f"flat within ±10%: {report['flat_within_10pct']})"
    )


if __name__ == "__main__":
    main()
