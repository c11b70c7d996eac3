"""DBOS Transact's side of ``benchmarks/durable.py`` (runs in DBOS's own virtualenv).

One process, as DBOS's docs run it: ``DBOS(config=...)``, ``DBOS.launch()``, a queue
declared with ``DBOS.register_queue`` and its defaults (no concurrency limit, a 1 s polling
interval), workflows put on it with ``DBOS.enqueue_workflow``. The workflow either calls
``--steps`` no-op ``@DBOS.step()`` functions or none (the no-op baseline).

The N workflows are enqueued *before* the queue is registered, so that processing does not
overlap the enqueue: the queue's worker thread starts dequeuing only once the queue exists
(within about two seconds: one check for new queues, then one polling interval). Times are
taken from the first workflow body's start to the last body's end (the same definition as
durq's handler lines) and to the moment every workflow is recorded ``SUCCESS`` ("results
in"); start-up, enqueue and the wait for the first poll are outside both.

    /tmp/dbosenv/bin/python benchmarks/peers/bench_dbos_durable.py --url URL --tasks N
        [--steps 5] [--worker-concurrency K]

Prints one JSON object on stdout; DBOS's own log goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from typing import Any

from dbos import DBOS, DBOSConfig

QUEUE = "durable_bench"

_lock = threading.Lock()
_rows: list[tuple[float, float, float]] = []
_expected = 0
_all_ended = threading.Event()


def record(start: float) -> None:
    """The body's start, its end and the process's CPU so far (durq's handler line)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    row = (start, time.time(), usage.ru_utime + usage.ru_stime)
    with _lock:
        _rows.append(row)
        if len(_rows) >= _expected:
            _all_ended.set()


@DBOS.step()
def noop() -> None:
    pass


@DBOS.workflow()
def with_steps(steps: int) -> int:
    start = time.time()
    for _ in range(steps):
        noop()
    record(start)
    return steps


@DBOS.workflow()
def without_steps() -> int:
    record(time.time())
    return 0


def main() -> None:
    global _expected
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="DBOS system_database_url")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5, help="0: the no-op workflow")
    parser.add_argument(
        "--worker-concurrency", type=int, default=None,
        help="register_queue(worker_concurrency=...); default: DBOS's (no limit)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    n = _expected = args.tasks

    config: DBOSConfig = {"name": "durq-durable-bench", "system_database_url": args.url}
    DBOS(config=config)
    DBOS.launch()
    try:
        began = time.time()
        if args.steps:
            handles = [DBOS.enqueue_workflow(QUEUE, with_steps, args.steps) for _ in range(n)]
        else:
            handles = [DBOS.enqueue_workflow(QUEUE, without_steps) for _ in range(n)]
        enqueued = time.time()
        options = {}
        if args.worker_concurrency is not None:
            options["worker_concurrency"] = args.worker_concurrency
        DBOS.register_queue(QUEUE, **options)  # processing starts at the queue's first poll
        if not _all_ended.wait(args.timeout):
            raise SystemExit(f"timed out: {len(_rows)} of {n} workflows ended")
        # Results in: no workflow of the queue left unfinished (polled only in the tail,
        # once every body has ended, so the polling does not compete with the work).
        while DBOS.list_workflows(
            queue_name=QUEUE, status=["ENQUEUED", "PENDING"], load_input=False,
            load_output=False,
        ):  # fmt: skip
            time.sleep(0.002)
        results_in = time.time()
        ok = DBOS.list_workflows(
            queue_name=QUEUE, status="SUCCESS", load_input=False, load_output=False
        )
        # Untimed checks: every workflow succeeded, its steps were recorded, its result reads.
        assert len(ok) == n, f"{len(ok)} of {n} workflows succeeded"
        recorded = DBOS.list_workflow_steps(handles[-1].get_workflow_id())
        assert len(recorded) == args.steps, recorded
        assert handles[0].get_result() == args.steps
        rows = sorted(_rows)
        result: dict[str, Any] = {
            "dbos_version": _version(),
            "enqueue_per_s": round(n / (enqueued - began), 1),
            "first_start_after_enqueue_s": round(rows[0][0] - enqueued, 3),
            "rows": rows,
            "results_in": results_in,
            "steps_recorded": len(recorded),
        }
    finally:
        DBOS.destroy()
    sys.stdout.write(json.dumps(result) + "\n")


def _version() -> str:
    from importlib.metadata import version

    return version("dbos")


if __name__ == "__main__":
    main()
