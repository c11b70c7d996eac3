"""Helpers of the multi-process limit tests: worker processes serving ``limits_app``, the
ledger they write, and checks on it."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import durq
from conformance import limits_app
from conformance.conftest import requires
from durq.brokers import open_broker
from durq.brokers.base import CAP_MULTI_PROCESS
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


async def wait_for_starts_after(ledger: Path, moment: float, count: int, timeout: float) -> None:
    """Wait until ``count`` attempts started after ``moment``, whichever tasks they are: after
    a killed worker's lease, its attempts are retried at once and compete for the slots it
    held with the tasks that waited for them."""
    deadline = time.monotonic() + timeout
    while len(starts_after(ledger, moment)) < count:
        assert time.monotonic() < deadline, starts_after(ledger, moment)
        await asyncio.sleep(0.05)


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


@dataclass
class Witness:
    """Broker round trips from this process every 0.1 s while workers run: an independent
    look at the machine and the server. A stretch with no answer for over half a second is a
    stall of the machine or the server, which no worker could have avoided."""

    answers: list[float] = field(default_factory=list)

    def stalls(self, longer_than: float = 0.5) -> list[tuple[float, float]]:
        """The stretches (wall clock) between two answers more than ``longer_than`` apart."""
        pairs = itertools.pairwise(self.answers)
        return [(a, b) for a, b in pairs if b - a > longer_than]


@asynccontextmanager
async def witness(broker_url: str) -> AsyncIterator[Witness]:
    seen = Witness()
    broker = open_broker(broker_url)

    async def run() -> None:
        while True:
            try:
                await broker.ping()
                seen.answers.append(time.time())
            except Exception:  # no answer is what a stall looks like
                pass
            await asyncio.sleep(0.1)

    task = asyncio.create_task(run())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await broker.close()


@dataclass
class Shortfall:
    """Starts a rate limit's bucket let go to waste within a window: while no task started
    for longer than the bucket takes to fill, its refill overflowed."""

    witnessed: float = 0.0  # tokens lost while the witness saw a stall
    unexplained: float = 0.0  # tokens lost while the machine and the server answered
    gaps: list[tuple[float, float, float]] = field(default_factory=list)  # (from, to, seen s)


def shortfall(
    starts: list[float], window: tuple[float, float], rate: int, stalls: list[tuple[float, float]]
) -> Shortfall:
    """The tokens of ``rate``/s wasted within ``window``: in each gap between starts, the time
    past its first second (the bucket holds one second's tokens) wastes them. The part of
    that time inside a stall of the witness is charged to the environment, the rest is not."""
    lo, hi = window
    got = Shortfall()
    for a, b in itertools.pairwise(starts):
        a, b = max(a, lo), min(b, hi)
        if b - a <= 1.0:
            continue
        full = a + 1.0  # from here on the bucket is full and its refill is lost
        seen = sum(max(0.0, min(b, e) - max(full, s)) for s, e in stalls)
        got.witnessed += seen * rate
        got.unexplained += (b - full - seen) * rate
        got.gaps.append((round(a - lo, 2), round(b - lo, 2), round(seen, 2)))
    return got
