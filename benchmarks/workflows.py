"""Fan-in of 100: a durq workflow of 100 members then one dependent, beside Celery's
``chord(group(100 no-ops), callback)``, in the same run.

* durq: each workflow is ``wf.add("bench:member", ...)`` 100 times and
  ``wf.add("bench:merge", ..., after=members)`` (the merge reads the 100 results in
  ``ctx.dependencies``), on Redis and on PostgreSQL (a key prefix or a schema of its own), run
  by the shipped ``durq worker workflows:app`` with the README's defaults (10 slots).
* Celery (``peers/bench_celery_chord.py``, in its own venv ``.venv-peers/celery``, installed
  from PyPI when missing): ``chord(group(member.s() x 100), merge.s())`` with a Redis broker and
  the Redis result backend, ``celery worker --pool prefork -c 2`` (its documented defaults
  otherwise).

Every task writes its own start and end (``peers._common.note``: one line, one ``write``, to
a per-process file), and both systems are measured from those lines the same way:

1. ``--workflows`` workflows (chords) are sent, then the worker is started: workflows/s is
   that number over the time from the first member's start to the last dependent's end;
2. with the worker idle, ``--latency-workflows`` more are sent one at a time, each once the
   previous one's dependent ran: the time from a workflow's last member's end to its
   dependent's start (p50, p99), with no backlog in front of the dependent. The same figure
   in phase 1 (behind the backlog) is shown as well.

Each round runs every system once, in the reverse order of the round before, so that the
machine's other load falls on all alike; the medians of the rounds are reported, with the
load average.

    .venv/bin/python benchmarks/workflows.py [--workflows 100] [--latency-workflows 50]
        [--rounds 3] [--systems durq-redis,durq-postgresql,celery] [--json]
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
from collections import defaultdict
from pathlib import Path
from typing import Any

from peers._common import _stop, _wait, durq_worker, ended, lines, note, percentile, text_table
from run import COMMON_REQUIREMENTS, PEERS, ensure_venv, venv_python

import durq
from durq.bench.isolation import Isolated

HERE = Path(__file__).resolve().parent
MEMBERS = 100
SYSTEMS = ("durq-redis", "durq-postgresql", "celery")


def build(url: str, members: int = MEMBERS) -> durq.App:
    """The app ``durq worker workflows:app`` runs (and the parent enqueues with)."""
    app = durq.App(url)

    @app.task("bench:member", max_retry=0)
    async def member(payload: dict[str, Any]) -> int:
        note("member", time.time(), payload["w"])
        return int(payload["i"])

    @app.task("bench:merge", max_retry=0)
    async def merge(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        start = time.time()
        assert len(ctx.dependencies) == payload["n"]
        note("merge", start, payload["w"])
        return len(ctx.dependencies)

    return app


# `durq worker workflows:app` imports this module; the broker comes from DURQ_BROKER_URL.
app = build(os.environ.get("DURQ_BROKER_URL", "memory://"))


def workflow(number: int, members: int) -> durq.Workflow:
    wf = durq.Workflow("fan-in", id=f"bench-{number}")
    nodes = [wf.add("bench:member", {"w": number, "i": i}, name=f"m{i}") for i in range(members)]
    wf.add("bench:merge", {"w": number, "n": members}, name="merge", after=nodes)
    return wf


async def durq_run(base: str, signals: str, args: argparse.Namespace) -> dict[str, Any]:
    """Phase 1 and 2 with ``durq worker`` on a fresh isolated broker."""
    isolated = Isolated.create(base)  # a schema or a key prefix of its own
    await isolated.prepare()
    producer = build(isolated.url, args.members)
    try:
        started = time.perf_counter()
        for w in range(args.workflows):
            await producer.enqueue_workflow(workflow(w, args.members))
        enqueue_s, n = time.perf_counter() - started, args.workflows
        with open(os.path.join(signals, "worker.log"), "wb") as log:
            proc = durq_worker("workflows:app", isolated.url, signals, log)
            try:
                await _wait(lambda: ended(signals, "merge") >= n, 600, "the workflows", proc)
                for w in range(args.workflows, args.workflows + args.latency_workflows):
                    await producer.enqueue_workflow(workflow(w, args.members))
                    await _wait(lambda w=w: ended(signals, "merge") > w, 60, f"workflow {w}", proc)
            finally:
                _stop(proc)
        return {"enqueue_workflows_per_s": args.workflows / enqueue_s}
    finally:
        await producer.close()
        await isolated.cleanup()


def celery_run(signals: str, args: argparse.Namespace) -> dict[str, Any]:
    """Phase 1 and 2 with Celery, in its venv (``peers/bench_celery_chord.py``)."""
    command = [str(venv_python(PEERS["celery"][0])), str(HERE / "peers" / "bench_celery_chord.py")]
    command += ["--workflows", str(args.workflows), "--members", str(args.members)]
    command += ["--latency-workflows", str(args.latency_workflows)]
    env = {**os.environ, "BENCH_SIGNAL_DIR": signals, "BENCH_REDIS_URL": args.celery_redis}
    proc = subprocess.run(
        command, cwd=HERE / "peers", env=env, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"Celery run exited with {proc.returncode}: {proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def figures(signals: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run's figures from the tasks' own lines (start, end, workflow number)."""
    ends: dict[int, list[float]] = defaultdict(list)
    first_start = float("inf")
    for start, end, w in lines(signals, "member"):
        ends[int(w)].append(end)
        if w < args.workflows:
            first_start = min(first_start, start)
    merges = {int(w): (start, end) for start, end, w in lines(signals, "merge")}
    total = args.workflows + args.latency_workflows
    assert sorted(merges) == list(range(total)), "a dependent ran twice or not at all"
    assert all(len(ends[w]) == args.members for w in range(total)), "a member is missing"
    last_end = max(merges[w][1] for w in range(args.workflows))
    seconds = last_end - first_start
    gap = {w: 1000 * (merges[w][0] - max(ends[w])) for w in range(total)}
    idle = [gap[w] for w in range(args.workflows, total)]
    backlog = [gap[w] for w in range(args.workflows)]
    return {
        "seconds": seconds,
        "workflows_per_s": args.workflows / seconds,
        "tasks_per_s": args.workflows * (args.members + 1) / seconds,
        "start_ms_p50": percentile(idle, 50),
        "start_ms_p99": percentile(idle, 99),
        "start_ms_max": max(idle),
        "backlog_start_ms_p50": percentile(backlog, 50),
        "backlog_start_ms_p99": percentile(backlog, 99),
    }


async def one(system: str, args: argparse.Namespace) -> dict[str, Any]:
    signals = tempfile.mkdtemp(prefix="durq-workflows-")
    try:
        if system == "celery":
            extra = await asyncio.to_thread(celery_run, signals, args)
        else:
            base = args.redis if system == "durq-redis" else args.postgres
            extra = await durq_run(base, signals, args)
        return {**figures(signals, args), **extra}
    finally:
        shutil.rmtree(signals, ignore_errors=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    systems = args.systems.split(",")
    if "celery" in systems:
        reason = ensure_venv(PEERS["celery"][0], [*PEERS["celery"][1], *COMMON_REQUIREMENTS])
        if reason is not None:
            raise SystemExit(f"Celery: {reason}")
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    loads = []
    version = None
    for r in range(args.rounds):
        order = systems if r % 2 == 0 else systems[::-1]
        for system in order:
            loads.append(os.getloadavg()[0])
            result = await one(system, args)
            version = result.pop("version", version)
            runs[system].append(result)
            if not args.json:
                print(
                    f"round {r + 1} {system:16} {result['workflows_per_s']:7.1f} workflows/s "
                    f"dependent start p50 {result['start_ms_p50']:.2f} ms "
                    f"p99 {result['start_ms_p99']:.2f} ms (load {loads[-1]:.2f})",
                    file=sys.stderr,
                )
    rows = []
    for system, results in runs.items():
        median = {k: statistics.median(x[k] for x in results) for k in results[0]}
        rows.append({
            "system": system,
            **{k: round(v, 2) for k, v in median.items()},
            "workflows_per_s_runs": [round(x["workflows_per_s"], 1) for x in results],
        })  # fmt: skip
    celery_rate = next((r["workflows_per_s"] for r in rows if r["system"] == "celery"), None)
    for row in rows:
        row["vs_celery"] = round(row["workflows_per_s"] / celery_rate, 2) if celery_rate else None
    return {
        "workflows": args.workflows,
        "latency_workflows": args.latency_workflows,
        "members": args.members,
        "rounds": args.rounds,
        "durq_worker": "durq worker workflows:app (README defaults: 10 slots)",
        "celery": f"celery {version}, prefork -c 2, Redis broker and result backend",
        "load_average_at_starts": {
            "min": round(min(loads), 2),
            "median": round(statistics.median(loads), 2),
            "max": round(max(loads), 2),
        },
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    head = ("system", "workflows/s", "tasks/s", "x Celery", "start p50 ms", "start p99 ms",
            "behind backlog p50 ms", "runs (workflows/s)")  # fmt: skip
    body = [
        (r["system"], f"{r['workflows_per_s']:.1f}", f"{r['tasks_per_s']:.0f}",
         "" if r["vs_celery"] is None else f"{r['vs_celery']:.2f}", f"{r['start_ms_p50']:.2f}",
         f"{r['start_ms_p99']:.2f}", f"{r['backlog_start_ms_p50']:.1f}",
         " ".join(str(x) for x in r["workflows_per_s_runs"]))
        for r in result["rows"]
    ]  # fmt: skip
    out = text_table(head, body)
    out.append("")
    out.append(f"{result['workflows']} workflows of {result['members']} members then one "
               f"dependent per run, {result['latency_workflows']} more one at a time for the "
               f"start figures; medians of {result['rounds']} rounds")  # fmt: skip
    out.append(f"durq: {result['durq_worker']}; {result['celery']}")
    out.append(f"load average (1 min) at each run's start: {result['load_average_at_starts']}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=100, help="phase 1, per run")
    parser.add_argument("--latency-workflows", type=int, default=50, help="phase 2, per run")
    parser.add_argument("--members", type=int, default=MEMBERS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/6")
    parser.add_argument(
        "--celery-redis", default="redis://127.0.0.1:6379/7",
        help="Celery's broker and result backend (its database is emptied)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
