"""What one durable step's record (a checkpoint) costs on each broker, at the broker's seam.

A step's record is one fenced write of the task's steps before the handler goes on. A
worker sends the records its attempts make at the same time as one ``record_steps_many``
(``durq.worker.steps.step_writer``); a step recorded while nothing else is, as one
``record_steps``. This times both on 10 leased tasks of a fresh isolated store (a temporary
file, a schema or a key prefix of its own): N records one after the other, then N records
as batches of 10 (what ``durq worker --concurrency 10`` sends when its handlers step
together), and prints the wall time and this process's CPU per record. The broker server's
own work is in the wall time, not in the CPU.

    .venv/bin/python benchmarks/checkpoint_cost.py [--brokers sqlite,postgresql,redis] [-n 3000]
"""

from __future__ import annotations

import argparse
import time

from _stores import base_url, each_broker

import durq
from durq.bench.isolation import Isolated
from durq.brokers.base import ClaimParams, StepsParams
from durq.options import EnqueueRequest

#: One recorded no-op step, as the worker stores it.
STORED = '{"s0":{"result":null,"started":1765000000.1,"ended":1765000000.2,"attempt":1}}'


async def measure(broker_name: str, args: argparse.Namespace, tmpdir: str) -> None:
    n = args.n
    isolated = Isolated.create(base_url(broker_name, tmpdir))
    await isolated.prepare()
    app = durq.App(isolated.url)
    try:
        await app.enqueue_many([EnqueueRequest("bench:step", {}) for _ in range(10)])
        broker = await app.broker()
        claim = ClaimParams(queues=["default"], limit=10, worker_id="bench", lease_seconds=600)
        items = [StepsParams(lease.ref, STORED) for lease in await broker.claim(claim)]
        for item in items * 20:  # warm: connections, prepared statements, scripts
            await broker.record_steps(item)

        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            assert await broker.record_steps(items[i % len(items)])
        alone = (time.perf_counter() - t0, time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n // len(items)):
            assert all(await broker.record_steps_many(items))
        together = (time.perf_counter() - t0, time.process_time() - c0)
        for label, (wall, cpu), trips in (
            ("alone", alone, "1 round trip each"),
            ("10 together", together, f"1 round trip per {len(items)}"),
        ):
            print(
                f"{broker_name:10} {label:11} {1e6 * wall / n:6.0f} us wall "
                f"{1e6 * cpu / n:5.0f} us CPU per checkpoint ({trips})"
            )
    finally:
        await app.close()
        await isolated.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3000, help="records per way of sending")
    each_broker(parser, measure)


if __name__ == "__main__":
    main()
