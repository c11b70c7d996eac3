"""Where a workflow dependent's start goes, traced in one process, one workflow at a time.

A worker (the README's defaults: 10 slots) runs in this process on a fresh isolated broker;
``--workflows`` workflows of ``--members`` members and one dependent that reads their results
are enqueued one after another, each once the previous one's dependent ran. The broker's
calls are wrapped to note when they start and end, so the time from the last member's end
to the dependent's start is split into:

* **ack wait**: the last member's end until the call that stores its completion is sent;
* **completing call**: that call (``complete_and_claim``, or ``complete_many`` when the
  worker was idle), which releases the dependent;
* **to the claim**: from its end until the call that leases the dependent ends (0 when the
  completing call leased it): a second claim, a wake-up;
* **reading dependencies**: the lease until the dependencies' read is called (the attempt's
  start), the read (``Admin.get_outcomes``) and its decoding, and then the handler's start.

    .venv/bin/python benchmarks/dependent_start.py [--broker postgresql://...] [--workflows 30]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import durq
from durq.bench.isolation import Isolated

MEMBERS = 100


class Trace:
    """Broker calls and handler moments, on the monotonic clock."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float, set[str], set[str]]] = []
        self.inner: list[tuple[str, float, float]] = []
        self.reads: list[tuple[float, float, int]] = []
        self.ends: dict[str, float] = {}
        self.starts: dict[int, float] = {}

    def wrap(self, broker: Any) -> None:
        for name in ("complete_and_claim", "complete_many", "claim"):
            setattr(broker, name, self._call(name, getattr(broker, name)))
        # PostgreSQL: the statements a claim is made of.
        for name in ("_complete_claim", "_claim_limited", "_forward_and_claim", "_claim_again"):
            if hasattr(broker, name):
                setattr(broker, name, self._inner(name, getattr(broker, name)))
        admin = broker.admin
        # What the node reads of its dependencies (get_outcomes; get_tasks before it).
        name = "get_outcomes" if hasattr(admin, "get_outcomes") else "get_tasks"
        original = getattr(admin, name)

        @functools.wraps(original)
        async def read(queue: str, ids: list[str]) -> Any:
            start = time.perf_counter()
            out = await original(queue, ids)
            self.reads.append((start, time.perf_counter(), len(ids)))
            return out

        setattr(admin, name, read)

    def _inner(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def traced(*args: Any) -> Any:
            start = time.perf_counter()
            out = await method(*args)
            self.inner.append((name, start, time.perf_counter()))
            return out

        return traced

    def _call(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def traced(*args: Any) -> Any:
            items = args[0] if name != "claim" else ()
            done = {p.lease.id for p in items}
            start = time.perf_counter()
            out = await method(*args)
            leases = out[1] if name == "complete_and_claim" else out
            leased = {lease.task.id for lease in leases} if name != "complete_many" else set()
            self.calls.append((name, start, time.perf_counter(), done, leased))
            return out

        return traced


def build(url: str, trace: Trace) -> durq.App:
    app = durq.App(url)

    @app.task("trace:member", max_retry=0)
    async def member(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        trace.ends[ctx.id] = time.perf_counter()  # the handler's last moment
        return int(payload["i"])

    @app.task("trace:merge", max_retry=0)
    async def merge(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        trace.starts[payload["w"]] = time.perf_counter()
        return len(ctx.dependencies)

    return app


@dataclass
class Split:
    """One workflow's gap, in ms, by part; and the broker's inner steps (PostgreSQL: the
    claim statements) from the completing call to the dependent's lease."""

    parts: dict[str, float]
    steps: list[tuple[str, float]] = field(default_factory=list)


def split(trace: Trace, w: int, members: list[str], merge_id: str) -> Split:
    """One workflow's gap, in ms, by part."""
    last = max(members, key=lambda m: trace.ends[m])
    end = trace.ends[last]
    acked = next(c for c in trace.calls if last in c[3])
    leased = next(c for c in trace.calls if merge_id in c[4])
    read = next(r for r in trace.reads if r[0] >= leased[2] - 1e-9 and r[2] == len(members))
    start = trace.starts[w]
    steps = [(n, 1000 * (b - a)) for n, a, b in trace.inner if a >= acked[1] and b <= leased[2]]
    parts = {
        "gap": 1000 * (start - end),
        "ack_wait": 1000 * (acked[1] - end),
        "completing": 1000 * (acked[2] - acked[1]),
        "to_claim": 1000 * max(0.0, leased[2] - acked[2]),
        "to_read": 1000 * (read[0] - leased[2]),
        "read": 1000 * (read[1] - read[0]),
        "handler": 1000 * (start - read[1]),
        "same_call": float(acked is leased),
        "idle_ack": float(acked[0] == "complete_many"),
    }
    return Split(parts, steps)


async def run(args: argparse.Namespace) -> list[Split]:
    isolated = Isolated.create(args.broker)
    await isolated.prepare()
    trace = Trace()
    app = build(isolated.url, trace)
    out: list[Split] = []
    try:
        worker = durq.Worker(app, concurrency=10, scheduler=False, summary_interval=None)
        async with worker:
            assert worker.broker is not None
            trace.wrap(worker.broker)
            for w in range(args.warmup + args.workflows):
                wf = durq.Workflow("trace", id=f"trace-{w}")
                nodes = [
                    wf.add("trace:member", {"i": i}, name=f"m{i}", task_id=f"t{w}-m{i}")
                    for i in range(args.members)
                ]
                wf.add("trace:merge", {"w": w}, name="merge", after=nodes, task_id=f"t{w}-merge")
                await app.enqueue_workflow(wf)
                while w not in trace.starts:
                    await asyncio.sleep(0.002)
                await asyncio.sleep(0.05)  # the merge's own completion, before the next
                if w >= args.warmup:
                    ids = [f"t{w}-m{i}" for i in range(args.members)]
                    out.append(split(trace, w, ids, f"t{w}-merge"))
    finally:
        await app.close()
        await isolated.cleanup()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--workflows", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--members", type=int, default=MEMBERS)
    args = parser.parse_args()
    splits = asyncio.run(run(args))
    rows = [x.parts for x in splits]
    print(f"{len(rows)} workflows, load average {os.getloadavg()[0]:.2f}")
    for key in ("gap", "ack_wait", "completing", "to_claim", "to_read", "read", "handler"):
        values = sorted(r[key] for r in rows)
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(
            f"{key:12} p50 {statistics.median(values):7.2f} ms  p90 {p90:7.2f}  "
            f"max {values[-1]:7.2f}"
        )
    for x in splits[:5]:
        print("   steps of the completing call:", [(n, round(ms, 2)) for n, ms in x.steps])
    print(f"leased by the completing call: {sum(r['same_call'] for r in rows):.0f}/{len(rows)}")
    print(f"completed by complete_many (idle): {sum(r['idle_ack'] for r in rows):.0f}/{len(rows)}")


if __name__ == "__main__":
    main()
