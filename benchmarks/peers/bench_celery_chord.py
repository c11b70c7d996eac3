"""Celery's chord, run as its docs say, for ``benchmarks/workflows.py`` (runs in Celery's venv).

``chord(group(member.s(w, i) for i in range(MEMBERS)), merge.s(w))`` with a Redis broker
and the Redis result backend (a chord needs one), ``celery worker --pool prefork -c 2``.
Each task writes its own start and end (``_common.note``), as durq's do in ``workflows.py``.
The parent process:

1. empties the Redis database, sends ``--workflows`` chords, then starts the worker and
   waits until every callback has run (throughput, from the first member's start);
2. with the worker now idle, sends ``--latency-workflows`` chords one at a time, each once
   the previous one's callback ran (the time from the last member's end to the callback's
   start, without a backlog in front of the callback);

and prints one JSON line (Celery's version, the enqueue rate)::

    BENCH_SIGNAL_DIR=DIR BENCH_REDIS_URL=URL python bench_celery_chord.py
        [--workflows 100] [--members 100] [--latency-workflows 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import celery
from _common import SIGNAL_DIR as SIGNALS
from _common import _stop, _wait, ended, note, reset_redis
from celery import Celery, chord, group

REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")

app = Celery("bench_celery_chord", broker=REDIS, backend=REDIS)
app.conf.worker_hijack_root_logger = False


@app.task(name="member")
def member(workflow: int, i: int) -> int:
    note("member", time.time(), workflow)
    return i


@app.task(name="merge")
def merge(results: list[int], workflow: int) -> int:
    note("merge", time.time(), workflow)
    return len(results)


def send(workflow: int, members: int) -> None:
    chord(group(member.s(workflow, i) for i in range(members)))(merge.s(workflow))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    reset_redis()
    started = time.perf_counter()
    for w in range(args.workflows):
        send(w, args.members)
    enqueue_s = time.perf_counter() - started
    command = [os.path.join(os.path.dirname(sys.executable), "celery"), "-A",
               "bench_celery_chord", "worker", "--pool", "prefork", "-c", "2",
               "--loglevel", "WARNING", "--without-gossip", "--without-mingle"]  # fmt: skip
    log = open(os.path.join(SIGNALS, "worker.log"), "wb")
    proc = subprocess.Popen(
        command, cwd=Path(__file__).parent, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        await _wait(lambda: ended(SIGNALS, "merge") >= args.workflows, 600, "the chords", proc)
        for w in range(args.workflows, args.workflows + args.latency_workflows):
            send(w, args.members)
            await _wait(lambda w=w: ended(SIGNALS, "merge") > w, 60, f"chord {w}", proc)
    finally:
        _stop(proc)
        log.close()
        reset_redis()
    return {
        "version": celery.__version__,
        "enqueue_workflows_per_s": round(args.workflows / enqueue_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--latency-workflows", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
