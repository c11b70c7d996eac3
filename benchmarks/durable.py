"""Durable multi-step tasks: durq's ``ctx.step`` beside DBOS Transact's ``@DBOS.step()``,
in the same run, on SQLite and PostgreSQL (durq on Redis too).

Each system runs N tasks of two kinds, each on a fresh store (a temporary SQLite file, or a
new PostgreSQL database created and dropped here; durq on Redis: a fresh key prefix):

* ``5 steps``: a handler that runs five no-op durable steps, each recorded before the next.
  durq: ``for i in range(5): await ctx.step(f"s{i}", noop)``; DBOS: a ``@DBOS.workflow()``
  that calls a no-op ``@DBOS.step()`` five times.
* ``no-op``: the same without steps (a plain durq task, a DBOS workflow with no step), so
  that the ratio "5-step rate / no-op rate" says what the steps cost each system.

durq is driven the way limits.py drives it (the README's worker): N tasks queued with
``app.enqueue_many``, then ``durq worker durable:app --concurrency 10`` started as a
subprocess; every handler appends a line (start, end, the worker's CPU) to a per-process
file, which the parent counts from outside before it stops the worker. DBOS runs as its own
process in its own virtualenv (``peers/bench_dbos_durable.py``, DBOS's documented set-up
and queue defaults; see that file): the N workflows are enqueued before the queue is
registered, so both systems are timed on processing alone.

Figures, for both systems alike: ``seconds`` from the first handler's (workflow body's)
start to the last one's end; ``to results`` from the same start until the store records
every task finished (durq: ``completed`` in the queue's counts; DBOS: no workflow left
``ENQUEUED``/``PENDING``), polled only once every handler has ended; CPU per task is the
processing process's own CPU between the first and the last handler (database servers not
included). Within each round the runs go durq then DBOS, and the other way round in the
next round, so the machine's other load falls on both alike; medians are reported, and the
5-step/no-op ratio is the median of each round's ratio.

    python3 -m venv /tmp/dbosenv && /tmp/dbosenv/bin/pip install dbos
    .venv/bin/python benchmarks/durable.py [--tasks 1000] [--rounds 3] [--json]
        [--brokers sqlite,postgresql,redis] [--dbos-python /tmp/dbosenv/bin/python]
        [--no-dbos]   # durq alone (also when the DBOS python is missing)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from peers._common import _stop, _wait, durq_worker, ended, lines, record, text_table

import durq
from durq.bench.isolation import Isolated
from durq.options import EnqueueRequest
from durq.states import TaskState

HERE = Path(__file__).resolve().parent
QUEUE = "default"  # the README's worker listens to the default queue
STEPS = 5
KINDS = {"steps": STEPS, "noop": 0}  # kind -> steps per task


def noop() -> None:
    pass


def build(url: str) -> durq.App:
    """The app ``durq worker durable:app`` runs (and the parent enqueues with)."""
    app = durq.App(url)

    @app.task("bench:steps", max_retry=0)
    async def steps(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        start = time.time()
        for i in range(STEPS):
            await ctx.step(f"s{i}", noop)
        record("steps", start)

    @app.task("bench:noop", max_retry=0)
    async def plain(payload: dict[str, Any]) -> None:
        record("noop", time.time())

    return app


# `durq worker durable:app` imports this module; the broker comes from DURQ_BROKER_URL.
app = build(os.environ.get("DURQ_BROKER_URL", "memory://"))


# -- the parent --------------------------------------------------------------------------------


def figures(rows: list[Any], results_in: float, steps: int) -> dict[str, float]:
    """One run's figures from its handler lines (start, end, process CPU)."""
    n, first = len(rows), rows[0][0]
    seconds = max(end for _, end, _ in rows) - first
    cpus = [cpu for _, _, cpu in rows]
    return {
        "tasks": n,
        "seconds": seconds,
        "per_s": n / seconds,
        "steps_per_s": n * steps / seconds,
        "results_s": results_in - first,
        "cpu_us": 1e6 * (max(cpus) - min(cpus)) / max(n - 1, 1),
    }


@asynccontextmanager
async def fresh_database(maintenance: str, prefix: str) -> AsyncIterator[str]:
    """A new PostgreSQL database on the server of ``maintenance``; dropped afterwards."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    ident = sql.Identifier(name)
    async with await psycopg.AsyncConnection.connect(maintenance, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        yield urlunsplit(urlsplit(maintenance)._replace(path=f"/{name}"))
    finally:
        async with await psycopg.AsyncConnection.connect(maintenance, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@asynccontextmanager
async def store(broker: str, system: str, args: argparse.Namespace) -> AsyncIterator[str]:
    """A fresh, empty store URL for one run of ``system`` on ``broker``."""
    if broker == "postgresql":
        async with fresh_database(args.postgres, f"{system}_durable") as url:
            yield url
    elif broker == "redis":
        yield args.redis  # durq_run gives the run a key prefix of its own
    else:
        tmpdir = tempfile.mkdtemp(prefix=f"{system}-durable-")
        try:
            yield f"sqlite:///{tmpdir}/{system}.sqlite3"
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)


async def durq_run(base: str, kind: str, n: int, concurrency: int) -> dict[str, Any]:
    """N ``kind`` tasks queued on a fresh isolated broker, then ``durq worker`` until all
    have ended and the broker counts them completed."""
    isolated = Isolated.create(base)  # a file, a schema or a key prefix of its own
    await isolated.prepare()
    signals = tempfile.mkdtemp(prefix="durq-durable-")
    producer = build(isolated.url)
    try:
        for first in range(0, n, 1000):
            chunk = min(1000, n - first)
            outcomes = await producer.enqueue_many(
                [EnqueueRequest(f"bench:{kind}", {}) for _ in range(chunk)]
            )
        last_id = outcomes[-1].info.id
        await producer.inspector.queue_stats(QUEUE)  # warm: the tail poll below is one query
        with open(os.path.join(signals, "worker.log"), "wb") as log:
            concurrency_arg = ["--concurrency", str(concurrency)]
            proc = durq_worker("durable:app", isolated.url, signals, log, *concurrency_arg)
            try:
                await _wait(lambda: ended(signals, kind) >= n, 600, f"{n} {kind}", proc)

                async def completed() -> int:
                    stats = await producer.inspector.queue_stats(QUEUE)
                    return stats.sizes.get(TaskState.COMPLETED, 0)

                while await completed() < n:
                    await asyncio.sleep(0.002)
                results_in = time.time()
            finally:
                _stop(proc)
        # Untimed check: the steps were recorded on the task.
        task = await producer.inspector.get_task_info(QUEUE, last_id)
        assert len(task.steps) == KINDS[kind], task.steps
        return figures(lines(signals, kind), results_in, KINDS[kind])
    finally:
        await producer.close()
        shutil.rmtree(signals, ignore_errors=True)
        await isolated.cleanup()


def dbos_run(url: str, kind: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """``peers/bench_dbos_durable.py`` in DBOS's virtualenv, on the store ``url``."""
    command = [args.dbos_python, str(HERE / "peers" / "bench_dbos_durable.py")]
    command += ["--url", url, "--tasks", str(n), "--steps", str(KINDS[kind])]
    if args.dbos_worker_concurrency is not None:
        command += ["--worker-concurrency", str(args.dbos_worker_concurrency)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            command, cwd=HERE, stdout=subprocess.PIPE, stderr=log, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"DBOS run exited with {proc.returncode}:\n{tail}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    return {
        **figures(result["rows"], result["results_in"], KINDS[kind]),
        "dbos_version": result["dbos_version"],
        "enqueue_per_s": result["enqueue_per_s"],
    }


async def one(broker: str, system: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    async with store(broker, system, args) as url:
        if system == "durq":
            return await durq_run(url, kind, args.tasks, args.concurrency)
        return await asyncio.to_thread(dbos_run, url, kind, args.tasks, args)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    brokers = args.brokers.split(",")
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    version = None
    for r in range(args.rounds):
        for broker in brokers:
            order = [(s, k) for s in ("durq", "dbos") for k in KINDS]
            if broker == "redis" or not args.dbos:  # DBOS has no Redis store
                order = [(s, k) for s, k in order if s == "durq"]
            if r % 2:
                order.reverse()  # the other system first, so load falls on both alike
            for system, kind in order:
                result = await one(broker, system, kind, args)
                version = result.pop("dbos_version", version)
                result.pop("enqueue_per_s", None)
                runs.setdefault((broker, system, kind), []).append(result)
                if not args.json:
                    print(
                        f"round {r + 1} {broker:10} {system:4} {kind:5} "
                        f"{result['per_s']:8.1f} tasks/s",
                        file=sys.stderr,
                    )

    rows = []
    for (broker, system, kind), results in runs.items():
        median = {key: statistics.median(x[key] for x in results) for key in results[0]}
        rows.append({
            "broker": broker,
            "system": system,
            "task": f"{STEPS} steps" if kind == "steps" else "no-op",
            "tasks": args.tasks,
            "seconds": round(median["seconds"], 3),
            "per_s": round(median["per_s"], 1),
            "steps_per_s": round(median["steps_per_s"], 1),
            "results_s": round(median["results_s"], 3),
            "cpu_us_per_task": round(median["cpu_us"]),
            "per_s_runs": [round(x["per_s"], 1) for x in results],
        })  # fmt: skip
    ratios = {}
    for broker in brokers:
        for system in ("durq", "dbos"):
            steps, plain = runs.get((broker, system, "steps")), runs.get((broker, system, "noop"))
            if steps and plain:
                paired = [a["per_s"] / b["per_s"] for a, b in zip(steps, plain, strict=True)]
                ratios[f"{broker}/{system}"] = round(statistics.median(paired), 3)
    limit = args.dbos_worker_concurrency
    return {
        "tasks": args.tasks,
        "rounds": args.rounds,
        "durq_worker": f"durq worker durable:app --concurrency {args.concurrency}",
        "dbos": "not run"
        if not args.dbos
        else f"dbos {version}, one process, DBOS.register_queue defaults"
        + (" (no concurrency limit)" if limit is None else f", worker_concurrency={limit}"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
        # The 5-step task's rate over the no-op task's, median of each round's ratio.
        "steps_over_noop": ratios,
    }  # fmt: skip


def table(result: dict[str, Any]) -> str:
    head = ("broker", "system", "task", "tasks", "seconds", "tasks/s", "steps/s",
            "to results s", "CPU us/task")  # fmt: skip
    body = [
        (r["broker"], r["system"], r["task"], str(r["tasks"]), f"{r['seconds']:.3f}",
         f"{r['per_s']:.1f}", f"{r['steps_per_s']:.1f}", f"{r['results_s']:.3f}",
         str(r["cpu_us_per_task"]))
        for r in result["rows"]
    ]  # fmt: skip
    out = text_table(head, body)
    out.append("")
    out.append(f"durq: {result['durq_worker']}; DBOS: {result['dbos']}")
    out.append(f"load average at the end: {result['load_average']}")
    out.append("5-step rate / no-op rate (median of the rounds' ratios):")
    out += [f"  {key}: {value:.3f}" for key, value in result["steps_over_noop"].items()]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="tasks per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--brokers", default="sqlite,postgresql,redis")
    parser.add_argument("--concurrency", type=int, default=10, help="durq worker --concurrency")
    parser.add_argument(
        "--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a database to connect to while creating and dropping the runs' databases",
    )  # fmt: skip
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--dbos-python", default=os.environ.get("DBOS_PYTHON", "/tmp/dbosenv/bin/python"),
        help="the python of a virtualenv with `pip install dbos`",
    )  # fmt: skip
    parser.add_argument(
        "--dbos-worker-concurrency", type=int, default=None,
        help="DBOS queue worker_concurrency (default: DBOS's, no limit)",
    )  # fmt: skip
    parser.add_argument(
        "--no-dbos", dest="dbos", action="store_false",
        help="durq alone (also when --dbos-python does not exist)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.dbos and not os.path.exists(args.dbos_python):
        print(f"{args.dbos_python} not found: durq alone", file=sys.stderr)
        args.dbos = False
    result = asyncio.run(run(args))
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
