"""What a workflow's stored record costs: its creation, and reading progress from it.

On a fresh isolated store per broker (a temporary file, a schema or a key prefix of its own):

* ``create``: ``enqueue_graph`` of a fan-out of ``--nodes`` nodes (a root, the leaves, a
  merge) without and with its record, alternated in rounds so the machine's other load falls
  on each alike (best and median of the rounds);
* ``gauge``: ``app.inspector.count_workflows`` (what the Prometheus gauge reads on each
  refresh) over ``--workflows`` chains of ``--chain`` nodes kept (best and median of 5).

    .venv/bin/python benchmarks/workflow_record.py [--brokers sqlite,postgresql,redis]
        [--nodes 1000] [--rounds 7] [--workflows 1000] [--chain 10]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from _stores import base_url, each_broker

import durq
from durq.bench.isolation import Isolated
from durq.brokers.params import EnqueueParams, WorkflowNodeParams, WorkflowParams
from durq.observability.metrics import WORKFLOW_GAUGE_SCAN

_ids = itertools.count()


def fan_out(nodes: int) -> tuple[list[EnqueueParams], WorkflowParams]:
    """A root, ``nodes - 2`` leaves after it and a merge after them; fresh ids."""
    wf_id = f"b{next(_ids)}"
    names = ["root", *(f"leaf{i}" for i in range(nodes - 2)), "merge"]
    after: list[tuple[str, ...]] = [(), *((("root",),) * (nodes - 2)), tuple(names[1:-1])]
    items = [
        EnqueueParams(
            id=f"wf:{wf_id}:{name}",
            queue="default",
            type="bench:node",
            payload=b"{}",
            after=tuple(("default", f"wf:{wf_id}:{a}") for a in deps),
        )
        for name, deps in zip(names, after, strict=True)
    ]
    record = WorkflowParams(
        wf_id,
        "bench",
        86400.0,
        tuple(
            WorkflowNodeParams(name, "default", p.id, p.type, "cancel", deps)
            for name, deps, p in zip(names, after, items, strict=True)
        ),
    )
    return items, record


def _ms(seconds: list[float]) -> str:
    return f"best {min(seconds) * 1000:7.1f} ms  median {statistics.median(seconds) * 1000:7.1f} ms"


async def measure(broker_name: str, args: argparse.Namespace, tmpdir: str) -> None:
    isolated = Isolated.create(base_url(broker_name, tmpdir))
    await isolated.prepare()
    app = durq.App(isolated.url)
    try:
        broker = await app.broker()
        items, record = fan_out(args.nodes)
        await broker.enqueue_graph(items, record)  # warm: connections, statements, scripts
        plain: list[float] = []
        recorded: list[float] = []
        for r in range(args.rounds):
            ways = [(plain, False), (recorded, True)]
            for seen, with_record in reversed(ways) if r % 2 else ways:
                items, record = fan_out(args.nodes)
                t0 = time.perf_counter()
                await broker.enqueue_graph(items, record if with_record else None)
                seen.append(time.perf_counter() - t0)
        print(f"{broker_name:10} create {args.nodes} nodes, no record    {_ms(plain)}")
        print(f"{broker_name:10} create {args.nodes} nodes, with record  {_ms(recorded)}")

        for _ in range(args.workflows):
            wf = durq.Workflow("bench")
            previous: list[durq.Node] = []
            for i in range(args.chain):
                previous = [wf.add("bench:node", {}, name=f"n{i}", after=previous)]
            await app.enqueue_workflow(wf)
        refresh: list[float] = []
        for _ in range(5):
            t0 = time.perf_counter()
            await app.inspector.count_workflows(WORKFLOW_GAUGE_SCAN)
            refresh.append(time.perf_counter() - t0)
        kept = args.workflows + args.rounds * 2 + 1
        print(
            f"{broker_name:10} gauge refresh, {kept} workflows kept "
            f"(reads {min(kept, WORKFLOW_GAUGE_SCAN)})  {_ms(refresh)}"
        )
    finally:
        await app.close()
        await isolated.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--chain", type=int, default=10)
    each_broker(parser, measure)


if __name__ == "__main__":
    main()
