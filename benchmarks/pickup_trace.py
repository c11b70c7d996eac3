"""Where a pickup's time goes, step by step, per broker and build.

``make bench``'s pickup figure is one number: from ``app.enqueue`` in the driver to the
handler's start in ``durq worker``. This tool cuts it into the worker's steps by wrapping two
methods of the worker's broker class in the worker process (timestamps only, no change to
what they do): when ``wait_for_work`` returned (the wake-up arrived), when ``claim`` was
called and when it answered, and when the handler started. Per probe, then:

* enqueue → woken: the enqueue, the notification's way to the worker, its wait returning;
* woken → claim: the worker's loop from the wake-up to the claim call;
* claim: the claim's round trip with the client's work on either side of it;
* claim → handler: from the leases to the handler's first line.

Where the worker waits and claims in one call (``wait_and_claim``: Redis, a worker of one
queue), that call is traced too; its answer ends both the wait and the claim, so enqueue →
woken holds the whole of it and the two steps after it are 0.

Probes are enqueued at ``--rate`` per second on an idle worker (as ``make bench``'s pickup
phase does), after ``--history`` no-op tasks the worker has run in the same queue (``make
bench`` runs its 10,000 there first; 0 by default); each step's median (or ``--percentile``, nearest rank) is taken per run, and
the table gives the median of the runs and their range. Builds alternate run by run (A, B, B, A, ...) as in ``compare.py``.
The wrapping adds two calls per step to both builds alike, so compare builds, not these
figures with ``make bench``'s.

Storage is private to this tool: Redis database ``--redis-db`` (flushed before each run),
the PostgreSQL database ``durq_pickup`` (created again per run, dropped at the end) and a
temporary SQLite file.

    .venv/bin/python benchmarks/pickup_trace.py --build before=/tmp/old/py \\
        --build main=.venv/bin/python [--brokers redis,postgresql] [--runs 5] [--probes 300]
        [--percentile 99] [--history 10000]
"""

from __future__ import annotations

import bisect
import os
import statistics
import subprocess
import sys
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

PG_DB = "durq_pickup"

APP = """
import functools
import os
import time

import durq

app = durq.App(os.environ["DURQ_BROKER_URL"])
_log = open(os.environ["TRACE_LOG"], "a", buffering=1)


def _wrap(cls, name):
    original = getattr(cls, name)

    @functools.wraps(original)
    async def timed(self, *args, **kwargs):
        called = time.time()
        answer = await original(self, *args, **kwargs)
        _log.write(f"{name} {called:.6f} {time.time():.6f}\\n")
        return answer

    setattr(cls, name, timed)


_broker_class = type(app.new_broker())
_wrap(_broker_class, "wait_for_work")
_wrap(_broker_class, "claim")
if hasattr(_broker_class, "wait_and_claim"):
    _wrap(_broker_class, "wait_and_claim")


@app.task("trace:probe", retention=0)
async def probe(payload: dict) -> None:
    _log.write(f"start {time.time():.6f} {payload['t']:.6f}\\n")


_done = open(os.environ["TRACE_LOG"] + ".done", "ab", buffering=0)


# The history before the probes (--history): no-op tasks in the probes' queue, counted as
# one byte each, like make bench's.
@app.task("trace:noop", retention=0)
async def noop(payload: dict) -> None:
    _done.write(b".")
"""

#: Run by the build's interpreter: a fresh schema, the worker, the probes.
DRIVE = """
import asyncio
import os
import signal
import subprocess
import sys
import time

from durq.options import EnqueueRequest
from trace_app import app


async def main(probes: int, rate: float, history: int) -> None:
    broker = app.new_broker()
    await broker.migrate()
    await broker.close()
    for first in range(0, history, 1000):
        count = min(1000, history - first)
        await app.enqueue_many([EnqueueRequest("trace:noop", {}) for _ in range(count)])
    await app.enqueue("trace:probe", {"t": time.time()})  # connected before the first probe
    worker = subprocess.Popen(
        [sys.executable, "-m", "durq", "worker", "trace_app:app"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    done = os.environ["TRACE_LOG"] + ".done"
    try:
        deadline = time.monotonic() + 60 + history / 100
        while history and (not os.path.exists(done) or os.path.getsize(done) < history):
            if time.monotonic() > deadline:
                raise RuntimeError("the history tasks did not finish")
            await asyncio.sleep(0.05)
        await asyncio.sleep(3.0 if not history else 1.0)  # started (or done), and idle
        started = time.perf_counter()
        for i in range(probes):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await app.enqueue("trace:probe", {"t": time.time()})
        await asyncio.sleep(1.0)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        await app.close()


asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
"""

STEPS = ("enqueue → woken", "woken → claim", "claim", "claim → handler", "total")


def steps(log: Path, percentile: float = 50.0) -> dict[str, float]:
    """Each step's median (or ``percentile``, nearest rank) over the probes of one run, ms."""
    waits: list[float] = []
    claims: list[tuple[float, float]] = []
    starts: list[tuple[float, float]] = []
    for line in log.read_text().splitlines():
        kind, a, b = line.split()
        if kind == "wait_for_work":
            waits.append(float(b))
        elif kind == "claim":
            claims.append((float(a), float(b)))
        elif kind == "wait_and_claim":
            # The wait and the claim in one call (Redis, one queue): both end with its
            # answer, so enqueue → woken holds the claim too and the next two steps are 0.
            waits.append(float(b))
            claims.append((float(b), float(b)))
        else:
            starts.append((float(a), float(b)))
    waits.sort()
    claims.sort()
    calls = [c for c, _ in claims]
    per_step: dict[str, list[float]] = {step: [] for step in STEPS}
    for started, enqueued in sorted(starts)[1:]:  # the first was enqueued before the worker
        i = bisect.bisect_left(calls, started) - 1
        if i < 0:
            continue
        called, answered = claims[i]
        j = bisect.bisect_right(waits, called) - 1
        # Only a probe picked up by a wake-up: its claim follows a wait that ended after it
        # was enqueued (one found by a claim that was running anyway is left out).
        if j < 0 or waits[j] < enqueued:
            continue
        woken = waits[j]
        for step, seconds in zip(
            STEPS,
            (
                woken - enqueued,
                called - woken,
                answered - called,
                started - answered,
                started - enqueued,
            ),
            strict=True,
        ):
            per_step[step].append(1000 * seconds)
    if not per_step["total"]:
        raise RuntimeError(f"no probe was picked up by a wake-up ({log})")
    return {step: _at(values, percentile) for step, values in per_step.items()} | {
        "probes": len(per_step["total"])
    }


def _name(percentile: float) -> str:
    return "median" if percentile == 50.0 else f"{percentile:g}th percentile"


def _at(values: list[float], percentile: float) -> float:
    if percentile == 50.0:
        return statistics.median(values)
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * percentile / 100))]


def run_once(
    python: str,
    url: str,
    workdir: Path,
    probes: int,
    rate: float,
    percentile: float = 50.0,
    history: int = 0,
) -> dict[str, float]:
    log = workdir / "trace.log"
    log.unlink(missing_ok=True)
    log.with_name(log.name + ".done").unlink(missing_ok=True)
    env = {**os.environ, "DURQ_BROKER_URL": url, "TRACE_LOG": str(log)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(workdir)]))
    subprocess.run(
        [python, "-c", DRIVE, str(probes), str(rate), str(history)],
        cwd=workdir,
        env=env,
        check=True,
    )
    return steps(log, percentile)


def main() -> None:
    parser = builds_parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per build and broker")
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--rate", type=float, default=100.0, help="probes per second")
    parser.add_argument(
        "--percentile", type=float, default=50.0, help="of each step per run (default: median)"
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="no-op tasks the worker runs in the probes' queue before the probes "
        "(make bench runs 10,000 there first)",
    )
    parser.add_argument("--redis-db", type=int, default=11)
    args = parser.parse_args()
    builds = parse_builds(parser, args)
    workdir, urls = private_storage("durq-pickup-", redis_db=args.redis_db, pg_db=PG_DB)
    (workdir / "trace_app.py").write_text(APP)
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    print(
        f"{args.probes} probes at {args.rate:g}/s a run, after {args.history:,} tasks, "
        f"{args.runs} runs a build; "
        f"each step's {_name(args.percentile)} per run: the median of the runs (their range), ms\n"
    )
    print("| broker | build | " + " | ".join(STEPS) + " |")
    print("|---|---|" + "---:|" * len(STEPS))
    with dropped_at_the_end(args.brokers, PG_DB):
        for broker in args.brokers.split(","):
            runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in builds}
            for _, name, python in alternating(builds, args.runs):
                reset_storage(
                    broker, urls[broker], sqlite_file=workdir / "store.sqlite3", pg_db=PG_DB
                )
                runs[name].append(
                    run_once(
                        python,
                        urls[broker],
                        workdir,
                        args.probes,
                        args.rate,
                        args.percentile,
                        args.history,
                    )
                )
            for name, _ in builds:
                cells = []
                for step in STEPS:
                    values = [r[step] for r in runs[name]]
                    cells.append(
                        f"{statistics.median(values):.3f} ({min(values):.3f} to {max(values):.3f})"
                    )
                print(f"| {broker} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
