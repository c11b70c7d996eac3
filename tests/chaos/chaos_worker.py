"""A real worker process for the chaos scenarios: ``python chaos_worker.py URL LEDGER_DIR [opts]``.

Every handler appends ``start``/``end``/``cancel`` lines (task id, attempt, pid, wall time) to
``LEDGER_DIR/ledger-<pid>.log``, opened with ``O_APPEND`` and written with one ``write(2)`` per
line, so a line is either whole in the file or absent, and a SIGKILL cannot take back a line
that was written. The broker never sees the ledger: the checker compares the two.

``--ack-first`` is the negative control: it reports the task completed *before* running the
handler (the classic visibility-timeout bug), so a kill loses the tasks in flight."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import durq
from durq.brokers.base import CompleteParams
from durq.worker.executor import Executor, Running
from durq.worker.server import Worker

QUEUE = "chaos"
OTHER_QUEUE = "chaos_other"

parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("ledger")
parser.add_argument("--lease", type=float, default=4.0)
parser.add_argument("--concurrency", type=int, default=8)
parser.add_argument("--rescue", type=float, default=1.0)
parser.add_argument("--grace", type=float, default=10.0)
parser.add_argument("--max-lost", type=int, default=3)
parser.add_argument("--poll", type=float, default=0.5)
parser.add_argument("--ack-first", action="store_true")
args = parser.parse_args()

app = durq.App(args.url)
_fd = os.open(
    Path(args.ledger) / f"ledger-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
)


_steps_fd = os.open(
    Path(args.ledger) / f"steps-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
)


def step_line(kind: str, task_id: str, step: int) -> None:
    """``do`` (a step's side effect ran), ``rec`` (its record is stored), ``fin`` (the
    durable task's handler returned), one ``write(2)`` each, in ``steps-<pid>.log``."""
    os.write(_steps_fd, f"{kind} {task_id} {step} {os.getpid()} {time.time():.6f}\n".encode())


def ledger(kind: str, ctx: durq.TaskContext) -> None:
    os.write(_fd, f"{kind} {ctx.id} {ctx.retried} {os.getpid()} {time.time():.6f}\n".encode())


async def _run(ctx: durq.TaskContext, seconds: float) -> dict[str, Any]:
    ledger("start", ctx)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        ledger("cancel", ctx)
        raise
    ledger("end", ctx)
    return {"pid": os.getpid()}


@app.task("chaos:work", queue=QUEUE, max_retry=25)
async def work(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    return await _run(ctx, float(payload.get("ms", 10)) / 1000)


@app.task("chaos:other", queue=OTHER_QUEUE, max_retry=25)
async def other(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    return await _run(ctx, float(payload.get("ms", 10)) / 1000)


@app.task("chaos:merge", queue=QUEUE, max_retry=25)
async def merge(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    # A group's follow-up: returns what it was told about its members (the test checks it).
    ledger("start", ctx)
    states = [m["state"] for m in payload["members"]]
    ledger("end", ctx)
    return {"size": payload["group"]["size"], "completed": states.count("completed")}


@app.task("chaos:sync", queue=QUEUE, max_retry=25)
def sync_work(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    ledger("start", ctx)
    time.sleep(float(payload.get("ms", 10)) / 1000)
    ledger("end", ctx)
    return {"pid": os.getpid()}


@app.task("chaos:durable", queue=QUEUE, max_retry=25)
async def durable(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    """Five steps with a durable sleep after the second and the fourth."""
    for i in range(5):

        async def side_effect(i: int = i) -> int:
            step_line("do", ctx.id, i)
            await asyncio.sleep(float(payload.get("ms", 5)) / 1000)
            return i

        assert await ctx.step(f"s{i}", side_effect) == i
        step_line("rec", ctx.id, i)
        if i in (1, 3):
            await ctx.sleep(f"z{i}", float(payload.get("nap_ms", 300)) / 1000)
    step_line("fin", ctx.id, 5)
    return {"steps": 5}


#: How many rows a ``chaos:fanout`` task finds (one child node each).
FAN_OUT_ROWS = 10


@app.task("chaos:fanout", queue=QUEUE, max_retry=25)
async def fanout(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    """Fan-out decided at run time: a child workflow of one node per row and their sum."""
    step_line("do", ctx.id, 0)  # every run of the handler, before and after its wait
    wf = durq.Workflow("rows", queue=QUEUE)
    rows = [
        wf.add("chaos:row", {"ms": payload.get("ms", 5), "n": n}, name=f"r{n}")
        for n in range(FAN_OUT_ROWS)
    ]
    wf.add("chaos:rowsum", {}, name="sum", after=rows)
    got = await ctx.run_workflow(wf, timeout=900)
    step_line("fin", ctx.id, 0)
    return {"sum": got["sum"]}


@app.task("chaos:row", queue=QUEUE, max_retry=25)
async def row(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
    await _run(ctx, float(payload["ms"]) / 1000)
    return int(payload["n"])


@app.task("chaos:rowsum", queue=QUEUE, max_retry=25)
async def rowsum(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
    ledger("start", ctx)
    ledger("end", ctx)
    return sum(int(v) for v in ctx.dependencies.values())


_node_fd = os.open(
    Path(args.ledger) / f"nodes-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
)


@app.task("chaos:node", queue=QUEUE, max_retry=25)
async def node(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    """A workflow node: notes what it saw of its dependencies when it started (``start``,
    with the run's token) and its result when it returned (``end``), one JSON line each in
    ``nodes-<pid>.log``. Its value is its index plus its dependencies' values, modulo
    ``mod``; its token is new on every run, so that a dependent's line shows which run's
    result it was handed."""
    seen = {name: [r["t"], r["v"]] for name, r in ctx.dependencies.items()}
    token = f"{os.getpid()}.{ctx.retried}.{time.monotonic_ns()}"
    line = {"k": "start", "id": ctx.id, "t": token, "at": time.time(), "deps": seen}
    os.write(_node_fd, (json.dumps(line) + "\n").encode())
    await asyncio.sleep(float(payload.get("ms", 10)) / 1000)
    value = (int(payload["i"]) + sum(v for _, v in seen.values())) % int(payload["mod"])
    os.write(
        _node_fd,
        (json.dumps({"k": "end", "id": ctx.id, "t": token, "at": time.time()}) + "\n").encode(),
    )
    return {"t": token, "v": value}


@app.task("chaos:poison", queue=QUEUE, max_retry=25)
async def poison(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
    ledger("start", ctx)
    os.kill(os.getpid(), signal.SIGKILL)  # takes its whole worker process down, every time


if args.ack_first:
    _original = Executor._run_and_settle

    async def _ack_then_run(self: Executor, running: Running) -> str:
        # Deliberately wrong: acknowledge first, work second. A crash in between loses the task.
        lease = running.lease
        await self.broker.complete(CompleteParams(lease.ref, None, lease.task.retention))
        return await _original(self, running)

    Executor._run_and_settle = _ack_then_run  # type: ignore[method-assign]


class ChaosWorker(Worker):
    async def start(self) -> None:
        await super().start()
        (Path(args.ledger) / f"ready-{os.getpid()}").touch()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    worker = ChaosWorker(
        app,
        queues={QUEUE: 1, OTHER_QUEUE: 1},
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        rescue_interval=args.rescue,
        shutdown_timeout=args.grace,
        max_lost=args.max_lost,
        poll_interval=args.poll,
        promote_interval=0.2,
        scheduler=False,
    )
    asyncio.run(worker.run())
