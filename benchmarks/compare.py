"""Builds of durq side by side, ``make bench``'s figures, the same run: is a change faster?

Each build is a Python interpreter whose environment has that build of durq installed (for
an older commit: ``git worktree add /tmp/old <commit>``, a venv there, ``pip install -e
'/tmp/old[all]'``), or a wrapper script that sets ``PYTHONPATH=/tmp/old/src`` and runs this
venv's interpreter (the driver passes its ``PYTHONPATH`` on to the worker it starts, so the
worker runs that build too). Both are driven by *this* tree's ``peers/_common.py`` and
``peers/bench_durq.py``, so the workloads, the clocks and the shipped ``durq worker`` command
line are the same; only the installed durq differs. Runs alternate A, B, B, A, ... (the order
reversed every round) per broker so a change in the machine's other load touches every build
alike; the table gives the median of each figure and each build's ratio to the first (for
latency and CPU, lower is better). On a shared machine one run's figures can move by a fifth,
so each ratio comes with its paired spread: the ratio within each round (two runs next to each
other in time), the middle half of those ratios. A ratio whose whole middle half lies past 5 %
is a change; one whose middle half straddles 1.0 is not told apart from the noise. The
same interpreter given twice, under two labels, is a control: its ratio to itself shows how
far the machine moved each figure in that run, the yardstick for the other builds' ratios.

Storage is private to this tool: Redis database ``--redis-db`` (flushed before each run) and
the PostgreSQL database ``durq_compare`` (dropped and created again per run, dropped at the
end), so it can run beside ``make bench``.

    .venv/bin/python benchmarks/compare.py --build before=/tmp/old/.venv/bin/python \\
        --build after=.venv/bin/python [--brokers sqlite,redis,postgresql] [--rounds 3] \\
        [--tasks 10000] [--latency-tasks 500] [--worker-args "--log-level WARNING"] \\
        [--json runs.json] [--build before-again=/tmp/old/.venv/bin/python]
    .venv/bin/python benchmarks/compare.py --report runs.json   # the table of a saved run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from run import recreate_pg_database  # this directory is on sys.path when run as a script

HERE = Path(__file__).resolve().parent
PG_DB = "durq_compare"

#: (label, key in the driver's JSON); rates: higher is better, CPU and latency: lower
FIGURES: list[tuple[str, str]] = [
    ("enqueue one-by-one /s", "enqueue_per_s"),
    ("enqueue, 50 callers /s", "enqueue_concurrent_per_s"),
    ("enqueue bulk /s", "enqueue_bulk_per_s"),
    ("process /s", "process_per_s"),
    ("process /s from 1st", "process_from_first_per_s"),
    ("worker CPU ms per task", "worker_cpu_ms_per_task"),
    ("pickup p50 ms", "p50"),
    ("pickup p99 ms", "p99"),
]


def run_once(python: str, broker: str, args: argparse.Namespace) -> dict[str, Any]:
    if broker == "postgresql":
        recreate_pg_database(name=PG_DB)
    signals = tempfile.mkdtemp(prefix="durq-compare-")
    env = {
        **os.environ,
        "BENCH_SIGNAL_DIR": signals,
        "BENCH_DURQ_BROKER": broker,
        "BENCH_DURQ_WORKER_ARGS": args.worker_args,
        "BENCH_REDIS_URL": f"redis://127.0.0.1:6379/{args.redis_db}",
        "BENCH_PG_DSN": f"postgresql://postgres@127.0.0.1:5432/{PG_DB}",
    }
    cmd = [
        python,
        str(HERE / "peers" / "_common.py"),
        "bench_durq",
        "--tasks",
        str(args.tasks),
        "--latency-tasks",
        str(args.latency_tasks),
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=HERE / "peers", env=env, capture_output=True, text=True, timeout=1800
        )
    finally:
        shutil.rmtree(signals, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} on {broker}: {proc.stderr.strip().splitlines()[-3:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(result.pop("latency_ms", {}) or {})
    if result.get("worker_cpu_s") is not None:
        result["worker_cpu_ms_per_task"] = 1000 * result["worker_cpu_s"] / args.tasks
    return result


def alternating(builds: list[tuple[str, str]], rounds: int) -> Iterator[tuple[int, str, str]]:
    """(round, label, python) for each build in each round: A, B, then B, A, and so on, so
    a drift in the machine's other load touches every build alike."""
    for r in range(rounds):
        for label, python in builds if r % 2 == 0 else builds[::-1]:
            yield r, label, python


def private_storage(prefix: str, *, redis_db: int, pg_db: str) -> tuple[Path, dict[str, str]]:
    """A new temporary folder for a tool, and the URLs of its own storage per broker: a
    SQLite file in that folder (``store.sqlite3``), a Redis database, a PostgreSQL
    database."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    return workdir, {
        "sqlite": f"sqlite:///{workdir / 'store.sqlite3'}",
        "redis": f"redis://127.0.0.1:6379/{redis_db}",
        "postgresql": f"postgresql://postgres@127.0.0.1:5432/{pg_db}",
    }


@contextlib.contextmanager
def dropped_at_the_end(brokers: str, pg_db: str) -> Iterator[None]:
    """Drop a tool's own PostgreSQL database when the block ends, however it ends, and say
    the load average then (a figure is read against it)."""
    try:
        yield
    finally:
        if "postgresql" in brokers:
            recreate_pg_database(drop_only=True, name=pg_db)
        print(f"load average after: {os.getloadavg()}", file=sys.stderr)


def reset_storage(broker: str, url: str, *, sqlite_file: Path, pg_db: str) -> None:
    """Empty a tool's own storage before a run: the PostgreSQL database ``pg_db`` created
    again, the Redis database of ``url`` flushed, or the SQLite file and its WAL removed."""
    if broker == "postgresql":
        recreate_pg_database(name=pg_db)
    elif broker == "redis":
        import redis

        client = redis.Redis.from_url(url)
        client.flushdb()
        client.close()
    else:
        for suffix in ("", "-wal", "-shm"):
            sqlite_file.with_name(sqlite_file.name + suffix).unlink(missing_ok=True)


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def paired_spread(
    base: list[dict[str, Any]], other: list[dict[str, Any]], key: str
) -> tuple[float, float] | None:
    """The middle half (quartiles) of ``other``'s figure over ``base``'s, round by round."""
    ratios = sorted(
        o[key] / b[key]
        for b, o in zip(base, other, strict=False)
        if b.get(key) and o.get(key) is not None
    )
    if not ratios:
        return None
    if len(ratios) < 4:
        return ratios[0], ratios[-1]
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive")
    return quartiles[0], quartiles[2]


def table(
    runs: dict[tuple[str, str], list[dict[str, Any]]], labels: list[str], brokers: list[str]
) -> str:
    """The Markdown table of ``runs``: medians, ratios to the first build, paired spreads."""
    first = labels[0]
    ratios = [f"{label} / {first}" for label in labels[1:]]
    spreads = [f"{label} / {first}, middle half of rounds" for label in labels[1:]]
    lines = [
        "| broker | figure | " + " | ".join(labels + ratios + spreads) + " |",
        "|---|---|" + "---:|" * (3 * len(labels) - 2),
    ]
    for broker in brokers:
        for name, key in FIGURES:
            found = [median(runs[(broker, label)], key) for label in labels]
            values = [v for v in found if v is not None]
            if len(values) < len(found):
                continue
            base = values[0]
            cells = [f"{v:,.1f}" for v in values]
            cells += [f"{v / base:.2f}" if base else "—" for v in values[1:]]
            for label in labels[1:]:
                spread = paired_spread(runs[(broker, first)], runs[(broker, label)], key)
                cells.append(f"{spread[0]:.2f} to {spread[1]:.2f}" if spread else "—")
            lines.append(f"| {broker} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(path: Path) -> None:
    """Print the table of a run saved with ``--json`` (the builds in the order it holds)."""
    saved: dict[str, list[dict[str, Any]]] = json.loads(path.read_text())
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, value in saved.items():
        broker, label = key.split("/", 1)
        runs[(broker, label)] = value
    brokers = list(dict.fromkeys(broker for broker, _ in runs))
    labels = list(dict.fromkeys(label for _, label in runs))
    print(table(runs, labels, brokers))


def builds_parser(description: str, *, brokers: bool = True) -> argparse.ArgumentParser:
    """The options every tool that sets builds side by side takes: ``--build``, and
    ``--brokers`` unless the tool measures one broker only."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--build",
        action="append",
        default=[],
        help="LABEL=PYTHON of a build (two or more; ratios are to the first)",
    )
    if brokers:
        parser.add_argument("--brokers", default="sqlite,redis,postgresql")
    return parser


def parse_builds(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> list[tuple[str, str]]:
    """``--build LABEL=PYTHON`` options as (label, interpreter) pairs, two or more."""
    specs = [spec.split("=", 1) for spec in args.build]
    if len(specs) < 2 or any(len(s) != 2 for s in specs):
        parser.error("give two or more --build LABEL=PYTHON")
    labels = [label for label, _ in specs]
    if len(set(labels)) != len(labels):
        parser.error("give each --build its own LABEL (the same PYTHON twice is a control)")
    # Absolute, not resolved: the interpreter's path inside its venv is what selects the venv.
    return [(label, os.path.abspath(python)) for label, python in specs]


def main() -> None:
    parser = builds_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--latency-tasks", type=int, default=500)
    parser.add_argument("--worker-args", default="", help='extra flags for "durq worker"')
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("--report", type=Path, help="print the table of a saved --json run")
    args = parser.parse_args()
    if args.report:
        report(args.report)
        return
    builds = parse_builds(parser, args)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with dropped_at_the_end(args.brokers, PG_DB):
        for broker in args.brokers.split(","):
            for r, label, python in alternating(builds, args.rounds):
                print(f"{broker} round {r + 1}: {label}", file=sys.stderr, flush=True)
                runs.setdefault((broker, label), []).append(run_once(python, broker, args))
    labels = [label for label, _ in builds]
    load = os.getloadavg()
    print(
        f"`durq worker {args.worker_args}`".replace(" `", "`")
        + f" · {args.tasks:,} tasks, {args.latency_tasks} probes · median of {args.rounds} runs"
        f" each, alternating · {os.cpu_count()} CPUs, load average at the end"
        f" {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n"
    )
    print(table(runs, labels, args.brokers.split(",")))
    if args.json:
        args.json.write_text(
            json.dumps({f"{k[0]}/{k[1]}": v for k, v in runs.items()}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
