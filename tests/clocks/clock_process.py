"""A durq process for the clock tests, run under libfaketime by ``tests/clocks``.

``python clock_process.py enqueue URL SECONDS``: enqueue one ``clock:noop`` task with
``process_in=SECONDS`` and print its id (the task appends ``noop <id> <pid>`` to a worker's
MARKER when it runs).
``python clock_process.py worker URL MARKER LEASE``: a worker whose ``clock:long`` task
appends ``start <id> <pid>`` to MARKER, sleeps ``payload["seconds"]`` and appends ``end``;
its rescuer runs every 0.2 s, so a lease it wrongly takes for expired is stolen at once."""

from __future__ import annotations

import asyncio
import os
import sys

import durq

app = durq.App(sys.argv[2])
MARKER = sys.argv[3] if len(sys.argv) > 3 else os.devnull


@app.task("clock:noop", queue="clock")
def noop(payload: dict[str, object], ctx: durq.TaskContext) -> None:
    with open(MARKER, "a") as fh:
        fh.write(f"noop {ctx.id} {os.getpid()}\n")


@app.task("clock:long", queue="clock")
async def long(payload: dict[str, object], ctx: durq.TaskContext) -> None:
    with open(MARKER, "a") as fh:
        fh.write(f"start {ctx.id} {os.getpid()}\n")
    await asyncio.sleep(float(payload["seconds"]))  # type: ignore[arg-type]
    with open(MARKER, "a") as fh:
        fh.write(f"end {ctx.id} {os.getpid()}\n")


async def main() -> None:
    if sys.argv[1] == "enqueue":
        info = await app.enqueue("clock:noop", {}, process_in=float(sys.argv[3]))
        print(info.id, flush=True)
        await app.close()
        return
    worker = app.worker(
        queues=["clock"],
        concurrency=4,
        lease_seconds=float(sys.argv[4]),
        rescue_interval=0.2,
        poll_interval=0.2,
        shutdown_timeout=0.5,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
