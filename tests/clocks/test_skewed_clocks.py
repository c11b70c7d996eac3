"""Relative times follow the broker's clock, and healthy leases survive clocks that are off
or step: producers and workers run as real processes under libfaketime.

PostgreSQL and Redis have a clock of their own that every host shares. SQLite's broker is one
machine, whose wall clock is what its processes read (memory:// is one process)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durq.brokers import FullBroker, open_broker
from durq.brokers.base import ClaimParams, EnqueueParams
from servers import broker_url_for, drop_isolated

SCRIPT = str(Path(__file__).with_name("clock_process.py"))
SERVERS = ["postgres", "redis"]


def faked_env(lib: Path, spec_file: Path) -> dict[str, str]:
    """The environment of a process whose wall clock follows ``spec_file`` (re-read every
    second, so a test can step it), while its monotonic clock stays the machine's."""
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=str(lib),
        FAKETIME_TIMESTAMP_FILE=str(spec_file),
        FAKETIME_CACHE_DURATION="1",
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )
    return env


async def opened(url: str) -> FullBroker:
    broker = open_broker(url)  # the real clock: on one machine, the broker's clock
    await broker.migrate()
    await broker.connect()
    return broker


def enqueue_skewed(lib: Path, spec: Path, url: str, seconds: float) -> str:
    """Enqueue ``process_in=seconds`` from a process whose clock is 120 s ahead."""
    spec.write_text("+120s\n")
    done = subprocess.run(
        [sys.executable, SCRIPT, "enqueue", url, str(seconds)],
        env=faked_env(lib, spec),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("kind", SERVERS)
async def test_E2_a_skewed_producers_delay_counts_from_the_brokers_clock(
    kind: str, tmp_path: Path, faketime: Path
) -> None:
    url = broker_url_for(kind, tmp_path)
    broker = await opened(url)
    spec = tmp_path / "faketime"
    try:
        before = time.time()
        task_id = enqueue_skewed(faketime, spec, url, 15)
        after = time.time()
        info = await broker.admin.get_task("clock", task_id)
        assert info is not None and info.next_process_at and info.enqueued_at
        due = info.next_process_at.timestamp()
        # 15 s after the broker's clock read it, not 15 s after the producer's (135 s).
        assert before + 14 <= due <= after + 16, f"due {due - after:+.1f} s from now"
        assert due - info.enqueued_at.timestamp() == pytest.approx(15, abs=0.01)

        # And one real run, short: claimable 2 s after the enqueue, not 122 s.
        task_id = enqueue_skewed(faketime, spec, url, 2)
        enqueued = time.time()
        claim = ClaimParams(["clock"], 1, "w", 30)
        leases = []
        while not leases and time.time() - enqueued < 8:
            await asyncio.sleep(0.05)
            leases = await broker.claim(claim)
        assert leases and leases[0].task.id == task_id, "not claimable within 8 s"
        task = leases[0].task
        assert task.started_at and task.enqueued_at
        waited = task.started_at.timestamp() - task.enqueued_at.timestamp()  # broker clock
        assert 1.95 <= waited <= 3.5, waited
    finally:
        await broker.close()
        drop_isolated(kind, url)


async def workers_up(broker: FullBroker, n: int) -> None:
    """Wait until ``n`` workers registered (started processes are slow on a loaded machine)."""
    deadline = time.monotonic() + 60
    while len(await broker.admin.list_workers()) < n:
        assert time.monotonic() < deadline, "the workers did not start"
        await asyncio.sleep(0.1)


def starts(marker: Path) -> list[str]:
    lines = marker.read_text().splitlines() if marker.exists() else []
    return [line.split()[1] for line in lines if line.startswith("start ")]


def ends(marker: Path) -> list[str]:
    lines = marker.read_text().splitlines() if marker.exists() else []
    return [line.split()[1] for line in lines if line.startswith("end ")]


async def wait_for(check, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("kind", [*SERVERS, "sqlite"])
async def test_W1_a_stepped_worker_never_starts_a_second_copy_of_a_healthy_lease(
    kind: str, tmp_path: Path, faketime: Path
) -> None:
    """Worker B's wall clock steps 120 s ahead while workers A and B hold leases (8 s,
    renewed every 2 s: generous, the machine is shared); their rescuers run every 0.2 s and
    must find nothing expired. With a server, A keeps an honest clock; on SQLite's one
    machine the step is the machine's: A's clock steps too."""
    url = broker_url_for(kind, tmp_path)
    broker = await opened(url)
    marker = tmp_path / "marker"
    spec = tmp_path / "faketime"
    spec.write_text("+0\n")
    env = faked_env(faketime, spec)
    honest = subprocess.Popen(
        [sys.executable, SCRIPT, "worker", url, str(marker), "8"],
        env=env if kind == "sqlite" else None,
    )
    stepped = subprocess.Popen([sys.executable, SCRIPT, "worker", url, str(marker), "8"], env=env)
    try:
        await workers_up(broker, 2)

        for i in range(6):
            await broker.enqueue(
                EnqueueParams(f"t{i}", "clock", "clock:long", b'{"seconds": 6}', max_retry=3)
            )
        await wait_for(lambda: len(starts(marker)) >= 6, 30)
        spec.write_text("+120s\n")  # B's wall clock jumps; its leases and A's are healthy
        # A lease taken for expired goes to retry (an attempt left) and starts again.
        await wait_for(lambda: len(ends(marker)) >= 6 or len(starts(marker)) > 6, 30)
        await asyncio.sleep(0.5)  # a late duplicate would have started by now
        assert sorted(starts(marker)) == [f"t{i}" for i in range(6)]
    finally:
        for proc in (honest, stepped):
            proc.terminate()
        for proc in (honest, stepped):
            proc.wait(timeout=15)
        await broker.close()
        drop_isolated(kind, url)


@pytest.mark.parametrize("step", ["+120s", "-120s", "+0"])
async def test_E2_a_delay_on_sqlite_keeps_its_length_when_the_machines_clock_steps(
    step: str, tmp_path: Path, faketime: Path
) -> None:
    """The whole machine's wall clock steps while a task waits out ``process_in=4``: it runs
    about 4 s after it was enqueued, neither at once (+120 s) nor two minutes late (-120 s)."""
    url = broker_url_for("sqlite", tmp_path)
    broker = await opened(url)
    marker = tmp_path / "marker"
    spec = tmp_path / "faketime"
    spec.write_text("+0\n")
    env = faked_env(faketime, spec)
    worker = subprocess.Popen([sys.executable, SCRIPT, "worker", url, str(marker), "5"], env=env)
    try:
        await workers_up(broker, 1)
        producer = subprocess.Popen(
            [sys.executable, SCRIPT, "enqueue", url, "4"], env=env, stdout=subprocess.PIPE
        )
        assert producer.stdout is not None
        await asyncio.to_thread(producer.stdout.readline)  # the task id: it is stored
        enqueued = time.time()
        spec.write_text(f"{step}\n")  # every process of the machine sees the step
        assert producer.wait(timeout=60) == 0
        await wait_for(lambda: ran(marker), 20)
        waited = time.time() - enqueued
        # Due 4 s after the enqueue, found by the worker's 0.2 s poll; a loaded machine may
        # add seconds. Without the correction: 1-2 s (+120 s), or two minutes (-120 s).
        assert 3.5 <= waited <= 12, f"ran {waited:.1f} s after the enqueue"
    finally:
        worker.terminate()
        worker.wait(timeout=15)
        await broker.close()


def ran(marker: Path) -> bool:
    return marker.exists() and "noop " in marker.read_text()
