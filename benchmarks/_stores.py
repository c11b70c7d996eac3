"""The brokers the seam benchmarks run on, each on a fresh isolated store."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Awaitable, Callable

#: The servers CI runs; SQLite is a file in a temporary directory.
URLS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/postgres",
    "redis": "redis://127.0.0.1:6379/0",
}


def base_url(broker: str, tmpdir: str) -> str:
    """The broker's URL, for :class:`durq.bench.isolation.Isolated` to isolate."""
    return URLS.get(broker) or f"sqlite:///{tmpdir}/bench.sqlite3"


def each_broker(
    parser: argparse.ArgumentParser,
    measure: Callable[[str, argparse.Namespace, str], Awaitable[None]],
) -> None:
    """Parse ``--brokers`` (and the caller's options) and run ``measure(broker, args,
    tmpdir)`` on each broker in turn, in a temporary directory removed afterwards."""
    parser.add_argument("--brokers", default="sqlite,postgresql,redis")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="durq-bench-") as tmpdir:
        for name in args.brokers.split(","):
            asyncio.run(measure(name, args, tmpdir))
