"""Wake-ups of the SQLite broker between processes: a waiter in another process is woken by
a datagram (its poll is made far longer than the test, so only the datagram can wake it),
and a lost channel still delivers through the ``PRAGMA data_version`` poll."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durq.brokers.base import EnqueueParams
from durq.brokers.sqlite import SQLiteBroker, wakeup

pytestmark = pytest.mark.skipif(not wakeup.SUPPORTED, reason="no AF_UNIX datagram sockets")

# A waiter in its own process: one short wait binds its socket, then it waits for real and
# prints whether it was woken.
WAITER = """
import asyncio, sys
from durq.brokers.sqlite import SQLiteBroker

async def main():
    broker = SQLiteBroker(sys.argv[1], poll_interval=float(sys.argv[2]))
    await broker.connect()
    await broker.wait_for_work(["q"], 0.2)
    print("ready", flush=True)
    woken = await broker.wait_for_work(["q"], float(sys.argv[3]))
    print("woken" if woken else "timed out", flush=True)
    await broker.close()

asyncio.run(main())
"""


def start_waiter(db: Path, poll: float, timeout: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, str(db), str(poll), str(timeout)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def wait_for_socket(directory: Path) -> None:
    deadline = time.monotonic() + 30
    while not (directory.is_dir() and any(directory.iterdir())):
        assert time.monotonic() < deadline, "the waiter bound no socket"
        time.sleep(0.05)


async def enqueue(db: Path) -> None:
    broker = SQLiteBroker(str(db))
    await broker.connect()
    await broker.enqueue(EnqueueParams(id="t1", queue="q", type="t", payload=b"{}"))
    await broker.close()


def test_a_waiter_in_another_process_is_woken_by_the_channel(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    asyncio.run(SQLiteBroker(str(db)).connect())
    # Polling every hour and waiting as long: only the datagram wakes it within the minute.
    proc = start_waiter(db, 3600.0, 3600.0)
    try:
        wait_for_socket(Path(wakeup.directory_for(str(db))))
        time.sleep(1.0)  # let it park on its event (the data_version look is behind it)
        asyncio.run(enqueue(db))
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.strip() == "woken"
    assert proc.returncode == 0
    # Its socket went with it.
    assert list(Path(wakeup.directory_for(str(db))).iterdir()) == []


def test_a_lost_channel_still_delivers_through_the_poll(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    asyncio.run(SQLiteBroker(str(db)).connect())
    proc = start_waiter(db, 0.2, 30.0)
    try:
        directory = Path(wakeup.directory_for(str(db)))
        wait_for_socket(directory)
        shutil.rmtree(directory)  # the datagram has nowhere to go
        asyncio.run(enqueue(db))
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.strip() == "woken"


def test_the_sender_names_the_queues_and_removes_dead_sockets(tmp_path: Path) -> None:
    directory = tmp_path / "db.wake"
    directory.mkdir()
    stale = directory / "999999999.0"  # bound, then its process died: nobody reads it
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(stale))
    dead.close()
    # Another process's listener (named by a pid that is not ours, as the sender skips
    # this process's own sockets: they are woken in-process).
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(directory / "999999998.0"))
    sender = wakeup.Sender(str(directory))
    try:
        sender.send({"a", "b"})
        assert not stale.exists()
        assert live.recv(wakeup.MAX_DATAGRAM) == b"a\nb"
    finally:
        sender.close()
        live.close()


def test_no_socket_where_the_path_is_too_long_for_one(tmp_path: Path) -> None:
    listener = wakeup.Listener(str(tmp_path / ("d" * 120)))
    assert listener.open() is None  # logged once; the broker polls
    assert listener.drain() is None
