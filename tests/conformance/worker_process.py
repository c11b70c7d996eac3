"""A real worker process for the kill and signal tests: ``python worker_process.py URL MARKER``.

Its ``sleepy`` task writes MARKER (``start <id> <pid>``) when it starts and sleeps long; its
``returns`` task writes ``return <id> <pid>`` and returns at once; its ``answer`` task returns
``{"answer": n}``, kept (retention) for a waiter."""

from __future__ import annotations

import asyncio
import os
import sys

import durq

url, marker = sys.argv[1], sys.argv[2]
lease = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
app = durq.App(url)


@app.task("test:sleepy", queue="kill")
async def sleepy(payload: dict[str, object], ctx: durq.TaskContext) -> dict[str, object]:
    with open(marker, "a") as fh:
        fh.write(f"start {ctx.id} {os.getpid()} {ctx.retried}\n")
    await asyncio.sleep(float(payload.get("seconds", 60)))  # type: ignore[arg-type]
    return {"slept": payload.get("seconds")}


@app.task("test:returns", queue="kill")
def returns(payload: dict[str, object], ctx: durq.TaskContext) -> dict[str, object]:
    # The kill test SIGKILLs this process as soon as it reads the line: right after the
    # handler returns, around the moment the worker records the completion.
    with open(marker, "a") as fh:
        fh.write(f"return {ctx.id} {os.getpid()} {ctx.retried}\n")
    return {"n": payload.get("n")}


@app.task("test:answer", queue="kill", retention=600)
def answer(payload: dict[str, object]) -> dict[str, object]:
    # For App.wait across processes: kept after success so the waiter can read the result.
    return {"answer": payload.get("n")}


if __name__ == "__main__":
    worker = app.worker(
        queues=["kill"],
        concurrency=2,
        lease_seconds=lease,
        shutdown_timeout=1.0,
        poll_interval=0.2,
    )
    asyncio.run(worker.run())
