"""Counted instructions per enqueue, per claim and per completed task against a recorded
baseline: did a change make durq's hot paths cost more?

A rate or a CPU time moves with whatever else the machine runs; the instructions a process
executes barely do. Each figure is counted in a process of its own run under ``valgrind
--tool=callgrind --instr-atstart=no``: after a warm-up of every path, only the measured
section is counted (``callgrind.py``: start-up, imports and the set-up of each section stay
out), ``-n`` operations a section, in ``--rounds`` rounds of which the least count is kept
(work that follows the clock rather than the calls, a heartbeat or a pool's upkeep, adds to
some rounds more than others, and a run under valgrind on a loaded machine is slow). Every
thread of the process is counted (SQLite's database thread too); a broker server's own work
is not (PostgreSQL and Redis: the client side only). SQLite's timed WAL checkpoint is held
off, as in ``option_cost.py``. The sections:

* ``enqueue``: ``app.enqueue`` one after another;
* ``claim``: a claim of one task (``Broker.claim``, limit 1), the tasks put there by
  ``enqueue_many`` before the section;
* ``task``: a task run by the worker (``app.worker()``, concurrency 10, a no-op handler,
  ``retention=0``), from its claim to its stored completion: the worker is started on the
  paused queue and the tasks stored before the section, which unpauses the queue and ends
  when the last completion is stored.

Compared with the baseline (``benchmarks/baseline.json``, which notes the machine, the
Python and the commit it was recorded on), a figure more than ``--tolerance`` (5 %) above
its baseline fails the check: one line per figure, exit status 1. Counts are comparable only
on the same Python and the same versions of the libraries; re-record the baseline after
changing them, or after a change whose cost is wanted (``--record``).

    .venv/bin/python benchmarks/check.py [--brokers memory,sqlite] [-n 300] [--rounds 3]
    .venv/bin/python benchmarks/check.py --record          # measure, write the baseline
    .venv/bin/python benchmarks/check.py --current FILE    # compare saved figures, no run
    [--baseline PATH] [--tolerance 0.05] [--json FILE] [--postgres-url URL] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from callgrind import Marks, marks_library, section_counts

HERE = Path(__file__).resolve()
BASELINE = HERE.parent / "baseline.json"
#: The figures of each broker, one section each.
STEPS = ("enqueue", "claim", "task")
TOLERANCE = 0.05
DEFAULT_BROKERS = "memory,sqlite,postgresql,redis"
#: Server URLs for PostgreSQL and Redis; each run works in a fresh schema or key prefix.
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/14"


def workload(url: str, step: str, tasks: int, rounds: int) -> None:
    """The measured program (run under callgrind by this tree's or a build's interpreter):
    a warm-up of every path, then ``rounds`` sections of ``tasks`` of ``step``."""
    import durq
    from durq.brokers.base import ClaimParams
    from durq.brokers.sqlite import checkpoint
    from durq.options import EnqueueRequest

    # The timed WAL checkpoint's share would follow how long a section took under valgrind,
    # not its calls; the checkpoint inside a commit (by log size) still runs.
    kwdefaults = checkpoint.Checkpointer.__init__.__kwdefaults__
    assert kwdefaults is not None
    kwdefaults["delay"] = 1e9
    marks = Marks(os.environ.get("DURQ_CHECK_MARKS"))
    app = durq.App(url)

    @app.task("noop", retention=0)
    async def noop(payload: dict[str, int]) -> None:
        """Does nothing."""

    async def bulk(count: int) -> None:
        for start in range(0, count, 500):
            stop = min(count, start + 500)
            await app.enqueue_many([EnqueueRequest("noop", {"i": i}) for i in range(start, stop)])

    class Done(durq.WorkerHooks):
        """Ends a drain when every task it waits for has completed (no idle wait)."""

        def __init__(self) -> None:
            self.left = 0
            self.all_done = asyncio.Event()

        def task_finished(self, task: Any, outcome: str, duration: float) -> None:
            self.left -= 1
            if self.left == 0:
                self.all_done.set()

    done = Done()

    async def drain(count: int, counted: bool) -> None:
        """``count`` stored tasks run by a worker started on the paused queue; counted from
        the unpause to the last completion."""
        await app.inspector.pause_queue("default")
        await bulk(count)
        done.left = count
        done.all_done.clear()
        worker = app.worker(concurrency=10, scheduler=False, hooks=[done])
        await worker.start()
        if counted:
            marks.start()
        await app.inspector.unpause_queue("default")
        await done.all_done.wait()
        if counted:
            marks.stop(step)
        await worker.stop()

    async def run() -> None:
        broker = app.new_broker()
        await broker.connect()
        claim = ClaimParams(["default"], 1, "check", 300.0)
        # Warm-up: every step once, so that what runs only the first time stays out.
        await app.enqueue("noop", {"i": -1})
        await bulk(2)
        await broker.claim(claim)
        await drain(2, counted=False)
        for _ in range(rounds):
            if step == "enqueue":
                marks.start()
                for i in range(tasks):
                    await app.enqueue("noop", {"i": i})
                marks.stop(step)
            elif step == "claim":
                await bulk(tasks)
                marks.start()
                for _ in range(tasks):
                    await broker.claim(claim)
                marks.stop(step)
            else:
                await drain(tasks, counted=True)
        await broker.close()
        await app.close()

    asyncio.run(run())


def count(python: str, base: str, step: str, tasks: int, rounds: int, lib: str) -> float:
    """Instructions per operation of ``step`` (the least of ``rounds`` sections of ``tasks``),
    in a fresh place on the broker."""
    if base.startswith("memory"):
        return _count(python, [base, step, str(tasks), str(rounds)], lib)[step] / tasks
    from durq.bench.isolation import Isolated

    isolated = Isolated.create(None if base.startswith("sqlite") else base)
    try:
        asyncio.run(isolated.prepare())
        return _count(python, [isolated.url, step, str(tasks), str(rounds)], lib)[step] / tasks
    finally:
        asyncio.run(isolated.cleanup())


def _count(python: str, args: list[str], lib: str) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="durq-check-") as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd += [f"--callgrind-out-file={tmp}/out", python, str(HERE), "workload", *args]
        # A fixed hash seed: set and dict orders, and so the work, alike from run to run.
        env = {**os.environ, "PYTHONHASHSEED": "0", "DURQ_CHECK_MARKS": lib}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")
        return section_counts(f"{tmp}/out")


def measure(
    python: str,
    brokers: list[str],
    tasks: int,
    rounds: int,
    urls: dict[str, str],
    jobs: int = 2,
) -> dict[str, float]:
    """``{"<broker> <step>": instructions per operation}``; ``jobs`` runs at a time (a count
    does not depend on how fast its run went)."""
    runs = [(broker, step) for broker in brokers for step in STEPS]
    with marks_library() as lib, ThreadPoolExecutor(jobs) as pool:
        counts = pool.map(lambda run: count(python, urls[run[0]], run[1], tasks, rounds, lib), runs)
        counted = dict(zip(runs, counts, strict=True))
    figures: dict[str, float] = {}
    for (broker, step), value in counted.items():
        figures[f"{broker} {step}"] = round(value)
        print(f"{broker} {step}: {value:,.0f}", file=sys.stderr)
    return figures


def compare(
    baseline: dict[str, float], current: dict[str, float], tolerance: float = TOLERANCE
) -> list[str]:
    """One line per figure that rose more than ``tolerance`` over its baseline, or that the
    baseline has and the current run lacks; empty when the check passes."""
    failures = []
    for name, before in baseline.items():
        now = current.get(name)
        if now is None:
            failures.append(f"{name}: not measured (baseline {before:,.0f})")
        elif now > before * (1 + tolerance):
            rise = now / before - 1
            failures.append(
                f"{name}: {now:,.0f} instructions, {rise:+.1%} over the baseline {before:,.0f}"
                f" (tolerance {tolerance:.0%})"
            )
    return failures


def machine() -> dict[str, Any]:
    """What the counts depend on: the interpreter, the platform and the libraries."""
    cpu = ""
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for lib in ("psycopg", "redis", "hiredis", "msgspec"):
        try:
            from importlib.metadata import version

            versions[lib] = version(lib)
        except Exception:
            versions[lib] = None
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE.parent
    ).stdout.strip()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "valgrind": subprocess.run(
            ["valgrind", "--version"], capture_output=True, text=True
        ).stdout.strip(),
        "libraries": versions,
        "commit": commit,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        workload(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", help=f"default: the baseline's, or {DEFAULT_BROKERS}")
    parser.add_argument("-n", type=int, default=300, help="operations a section")
    parser.add_argument("--rounds", type=int, default=3, help="sections a run (the least kept)")
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    parser.add_argument("--record", action="store_true", help="write the baseline")
    parser.add_argument("--current", type=Path, help="compare these saved figures, no run")
    parser.add_argument("--json", type=Path, help="also write the measured figures here")
    parser.add_argument("--python", default=sys.executable, help="the interpreter measured")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--redis-url", default=REDIS_URL)
    args = parser.parse_args()
    saved = json.loads(args.baseline.read_text()) if args.baseline.exists() else None
    if args.current is not None:
        current = json.loads(args.current.read_text())["figures"]
    else:
        brokers = args.brokers or (saved["brokers"] if saved and not args.record else None)
        brokers = brokers or DEFAULT_BROKERS
        urls = {
            "memory": "memory://",
            "sqlite": "sqlite:///",
            "postgresql": args.postgres_url,
            "redis": args.redis_url,
        }
        current = measure(args.python, brokers.split(","), args.n, args.rounds, urls, args.jobs)
        result = {
            "brokers": brokers,
            "method": "sections",
            "n": args.n,
            "rounds": args.rounds,
            "machine": machine(),
            "figures": current,
        }
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        if args.record:
            args.baseline.write_text(json.dumps(result, indent=2) + "\n")
            print(f"baseline written: {args.baseline}")
    if saved is not None and saved.get("method") != "sections" and not args.record:
        sys.exit(f"{args.baseline} was counted another way (whole runs): record it again")
    if saved is None:
        if not args.record:
            sys.exit(f"no baseline at {args.baseline}: record one with --record")
        return
    print("instructions per task (callgrind)\n")
    print("| figure | baseline | now | ratio |")
    print("|---|---:|---:|---:|")
    for name, before in saved["figures"].items():
        now = current.get(name)
        cells = ("—", "—") if now is None else (f"{now:,.0f}", f"{now / before:.3f}")
        print(f"| {name} | {before:,.0f} | {cells[0]} | {cells[1]} |")
    if args.record:
        return
    failures = compare(saved["figures"], current, args.tolerance)
    for line in failures:
        print(line, file=sys.stderr)
    if failures:
        sys.exit(1)
    print(f"\nno figure rose more than {args.tolerance:.0%} over the baseline")


if __name__ == "__main__":
    main()
