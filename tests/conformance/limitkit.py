"""Helpers of the multi-process limit tests: worker processes serving ``limits_app``, the
ledger they write, and checks on it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import durq
from conformance import limits_app
from conformance.conftest import requires
from durq.brokers import open_broker
from durq.brokers.base import CAP_LIMITS, CAP_MULTI_PROCESS
from durq.options import EnqueueRequest

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"
APP = HERE / "limits_app.py"


def env(ledger: Path, broker_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)]),
        "DURQ_TEST_LEDGER": str(ledger),
        "DURQ_BROKER_URL": broker_url,
    }


@contextmanager
def workers(
    broker_url: str,
    ledger: Path,
    count: int,
    *,
    concurrency: int,
    lease: float = 30.0,
    cli: bool = False,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` worker processes serving the ledger app; stopped (then killed) at exit.

    ``cli``: the ``durq worker`` command with its defaults (30 s lease); else the app's own
    runner with ``lease`` seconds and a fast rescuer."""
    if cli:
        argv = [sys.executable, "-m", "durq", "worker", "limits_app:app", "--queues",
                limits_app.QUEUE, "--concurrency", str(concurrency), "--no-scheduler",
                "--log-level", "WARNING"]  # fmt: skip
    else:
        argv = [sys.executable, str(APP), broker_url, str(lease), str(concurrency)]
    procs = [subprocess.Popen(argv, env=env(ledger, broker_url)) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def client(broker_url: str) -> durq.App:
    """The ledger app's own definitions (its limits), enqueuing into ``broker_url``."""
    limits_app.app.rebind(broker_url)
    return limits_app.app


async def migrated(broker_url: str) -> None:
    broker = open_broker(broker_url)
    try:
        await broker.migrate()
    finally:
        await broker.close()


async def needs_processes(broker_url: str) -> None:
    """Skip unless other processes see the tasks and limits are enforced; migrate."""
    broker = open_broker(broker_url)
    requires(broker, CAP_MULTI_PROCESS)
    requires(broker, CAP_LIMITS)
    await migrated(broker_url)


async def wait_for_ledger(
    ledger: Path, count: int, timeout: float, prefix: str = "", *, kind: str = "end"
) -> limits_app.Ledger:
    """Wait until ``count`` attempts of keys starting with ``prefix`` wrote their ``kind``
    line (``"start"`` or ``"end"``); the ledger then."""
    deadline = time.monotonic() + timeout
    while True:
        got = limits_app.Ledger.read(ledger)
        seen = got.started(prefix) if kind == "start" else got.ended(prefix)
        if len(seen) >= count:
            return got
        assert time.monotonic() < deadline, f"only {len(seen)} of {count} {kind}ed"
        await asyncio.sleep(0.05)


def starts_after(ledger: Path, moment: float) -> list[float]:
    """When attempts started after ``moment`` (wall clock), in order."""
    lines = limits_app.Ledger.read(ledger).lines
    return sorted(at for kind, _, _, at, _ in lines if kind == "start" and at > moment)


async def enqueue_calls(app: durq.App, keys: int, tasks: int, seconds: float) -> None:
    requests = [
        EnqueueRequest("limits:call", {"partner": f"p{i % keys}", "seconds": seconds})
        for i in range(tasks)
    ]
    for start in range(0, len(requests), 500):
        await app.enqueue_many(requests[start : start + 500])


async def enqueue(broker_url: str, *, calls: tuple[int, int, float] | None = None,
                  rated: int = 0) -> None:  # fmt: skip
    """Queue ``calls`` (keys, tasks, seconds each: see :func:`enqueue_calls`) and ``rated``
    tasks of the ``api`` key (20/s) from a client of their own."""
    app = client(broker_url)
    try:
        if calls is not None:
            await enqueue_calls(app, *calls)
        if rated:
            await app.enqueue_many([EnqueueRequest("limits:rated", {}) for _ in range(rated)])
    finally:
        await app.close()


async def run_concurrency(
    broker_url: str, ledger: Path, *, procs: int, concurrency: int, keys: int, tasks: int,
    seconds: float, timeout: float, cli: bool = False,
) -> limits_app.Ledger:  # fmt: skip
    await enqueue(broker_url, calls=(keys, tasks, seconds))
    with workers(broker_url, ledger, procs, concurrency=concurrency, cli=cli):
        await wait_for_ledger(ledger, tasks, timeout)
    return limits_app.Ledger.read(ledger)


def assert_rate(starts: list[float], rate: int, slack: float) -> None:
    """No stretch of starts is faster than a full bucket plus ``rate`` a second; ``slack``
    seconds allow for a handler that logs its start a little after its claim."""
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            allowed = rate + 1 + rate * (starts[j] - starts[i] + slack)
            assert j - i + 1 <= allowed, (i, j, starts[j] - starts[i])
