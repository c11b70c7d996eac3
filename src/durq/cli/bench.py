"""``durq bench``: enqueue, processing and pickup-latency figures for a broker.

Runs on an isolated place of the broker (a temporary SQLite file by default; a fresh
PostgreSQL schema or Redis key prefix otherwise), which it removes afterwards."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from durq import ranges
from durq.cli.common import BrokerOpt, JsonOpt, console, print_json
from durq.worker.server import MAX_CONCURRENCY

if TYPE_CHECKING:
    from rich.table import Table

EPILOG = (
    "Examples:\n\n"
    "  durq bench\n\n"
    "  durq bench --tasks 20000 --concurrency 100 --json\n\n"
    "  durq bench --broker postgresql://localhost/app\n\n"
    "  durq bench --broker redis://localhost:6379/0 --latency-tasks 1000\n\n"
    "Without --broker (and $DURQ_BROKER_URL) it uses a temporary SQLite file. On PostgreSQL and "
    "Redis it writes only to a fresh schema or key prefix, and removes it at the end."
)


def bench_command(
    tasks: Annotated[
        int, typer.Option("--tasks", "-n", help="Tasks per enqueue and processing phase.")
    ] = 20_000,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", help="Concurrency of the one worker process.")
    ] = 100,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
    latency_tasks: Annotated[
        int, typer.Option("--latency-tasks", help="Pickup-latency probes (0 to skip).")
    ] = 1_000,
    latency_rate: Annotated[
        float, typer.Option("--latency-rate", help="Probes per second into the idle worker.")
    ] = 100.0,
    bulk_chunk: Annotated[
        int, typer.Option("--bulk-chunk", help="Tasks per enqueue_many call.")
    ] = 1_000,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Progress bar on stderr.")
    ] = True,
) -> None:
    """Quick in-process measurement of durq alone: enqueue rates, processing rate (a worker
    started by the tool, logging off) and pickup latency. For figures of the shipped
    `durq worker` command beside other task queues, use `make bench` in the repository."""
    ranges.integer("--tasks", tasks, 1, 10_000_000)
    ranges.integer("--concurrency", concurrency, 1, MAX_CONCURRENCY)
    ranges.integer("--latency-tasks", latency_tasks, 0, 1_000_000)
    ranges.real("--latency-rate", latency_rate, 0, 100_000, above=True)
    ranges.integer("--bulk-chunk", bulk_chunk, 1, 100_000)
    # Imported here, not at the top: every `durq` command (the worker too) imports this module.
    from durq.bench import BenchOptions, run_bench

    options = BenchOptions(
        tasks=tasks,
        concurrency=concurrency,
        broker=broker or os.environ.get("DURQ_BROKER_URL") or None,
        latency_tasks=latency_tasks,
        latency_rate=latency_rate,
        bulk_chunk=bulk_chunk,
        progress=progress,
    )
    result = asyncio.run(run_bench(options))
    if as_json:
        print_json(result)
    else:
        console.print(_table(result))


def _table(result: dict[str, Any]) -> Table:
    from rich.table import Table

    lat = result["latency_ms"]
    table = Table(
        title=f"durq bench: {result['broker']}, {result['tasks']:,} tasks, "
        f"concurrency {result['concurrency']}"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("enqueue one-by-one", f"{result['enqueue_per_s']:,.0f} tasks/s")
    table.add_row(
        f"enqueue bulk ({result['bulk_chunk']}/call)",
        f"{result['enqueue_bulk_per_s']:,.0f} tasks/s",
    )
    table.add_row("process (1 worker process)", f"{result['process_per_s']:,.0f} tasks/s")
    if result["latency_tasks"]:
        table.add_row(
            f"pickup latency ({result['latency_tasks']} at {result['latency_rate']:g}/s)",
            f"p50 {lat['p50']:.2f} · p95 {lat['p95']:.2f} · p99 {lat['p99']:.2f} ms",
        )
        local = result["latency_in_process_ms"]
        table.add_row(
            "pickup latency, in-process worker",
            f"p50 {local['p50']:.2f} · p95 {local['p95']:.2f} · p99 {local['p99']:.2f} ms",
        )
    machine = result["machine"]
    table.caption = (
        f"{machine['cpu_count']} CPUs · Python {machine['python']} · {machine['platform']}"
    )
    return table


def register(app: typer.Typer) -> None:
    """Add ``durq bench``."""
    app.command("bench", epilog=EPILOG)(bench_command)
