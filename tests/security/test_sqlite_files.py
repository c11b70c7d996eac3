"""The SQLite broker's files against a local user and a careless operator: the wake-up
directory next to the database (symlinks, another user's or an open directory, links and
files inside, a flood of datagrams) and the modes of the database, -wal, -shm and journal."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.cli.clikit import Cli, assert_one_line_error

from durq.brokers import open_broker
from durq.brokers.base import EnqueueParams
from durq.brokers.sqlite import SQLiteBroker, wakeup
from durq.errors import ConfigurationError, UnsafeFileError

pytestmark = pytest.mark.skipif(not wakeup.SUPPORTED, reason="no AF_UNIX datagram sockets")

OTHER_UID = 54321  # a user this test does not run as


def task(task_id: str = "t1") -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="q", type="t", payload=b"{}")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_wake_directory(tmp_path: Path) -> tuple[Path, Path]:
    """A database path and its wake-up directory, made beforehand writable by everyone."""
    db = tmp_path / "durq.sqlite3"
    wake = Path(wakeup.directory_for(str(db)))
    wake.mkdir()
    wake.chmod(0o777)
    return db, wake


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def umask_022() -> Iterator[None]:
    with umask(0o022):
        yield


def receiver(path: Path) -> socket.socket:
    """A socket the test owns, where a wake-up must never arrive."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    return sock


def assert_nothing_received(sock: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        sock.recv(wakeup.MAX_DATAGRAM)


async def enqueue_once(db: Path) -> None:
    broker = SQLiteBroker(str(db))
    try:
        await broker.enqueue(task())
    finally:
        await broker.close()


async def enqueue_nothing(db: Path) -> None:
    """Create and migrate the database."""
    broker = SQLiteBroker(str(db))
    await broker.connect()
    await broker.close()


# ---------------------------------------------------------------- the wake-up directory


async def test_a_symlinked_wake_directory_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    target = tmp_path / "precious"
    target.mkdir()
    (target / "999999.0").write_text("keep me")  # named like a socket of another process
    (target / "notes.txt").write_text("keep me too")
    Path(wakeup.directory_for(str(db))).symlink_to(target)
    broker = SQLiteBroker(str(db))
    with pytest.raises(UnsafeFileError, match=r"symlink.*remove it"):
        await broker.connect()
    await broker.close()
    assert sorted(p.name for p in target.iterdir()) == ["999999.0", "notes.txt"]


async def test_a_wake_directory_symlinked_after_connect_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    broker = SQLiteBroker(str(db))
    await broker.connect()
    target = tmp_path / "precious"
    target.mkdir()
    (target / "999999.0").write_text("keep me")
    Path(wakeup.directory_for(str(db))).symlink_to(target)
    try:
        await broker.enqueue(task())  # written: the wake-up is what is refused
        assert await broker.wait_for_work(["q"], 0.05)
    finally:
        await broker.close()
    assert [p.name for p in target.iterdir()] == ["999999.0"]
    assert (target / "999999.0").read_text() == "keep me"


def test_the_cli_names_the_refused_files_in_one_line(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    Path(wakeup.directory_for(str(tmp_path / "durq.sqlite3"))).symlink_to(tmp_path / "elsewhere")
    assert_one_line_error(cli("migrate"), 2, "durq.sqlite3.wake is a symlink", "remove it")
    bad_mode = cli("migrate", "--broker", f"sqlite:///{tmp_path / 'other.db'}?file_mode=0755")
    assert_one_line_error(bad_mode, 2, "file_mode 0755")


async def test_links_and_files_inside_the_wake_directory_get_nothing(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    wake = Path(wakeup.directory_for(str(db)))
    wake.mkdir(mode=0o700)
    victim = receiver(tmp_path / "victim.sock")  # e.g. /dev/log
    (wake / "999999.0").symlink_to(victim.getsockname())
    (wake / "999999.1").write_text("not a socket")
    try:
        await enqueue_once(db)
        assert_nothing_received(victim)
    finally:
        victim.close()
    assert (wake / "999999.1").read_text() == "not a socket"
    assert (wake / "999999.0").is_symlink()


async def test_an_open_wake_directory_of_ours_is_tightened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, wake = open_wake_directory(tmp_path)
    broker = SQLiteBroker(str(db))
    with caplog.at_level(logging.WARNING, "durq.sqlite"):
        await broker.wait_for_work(["q"], 0.01)  # binds its socket there
    await broker.close()
    assert mode_of(wake) == 0o700
    assert "tightened" in caplog.text


async def test_a_new_wake_directory_is_0700(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    with umask(0):  # the mode does not come from the umask
        broker = SQLiteBroker(str(db))
        await broker.wait_for_work(["q"], 0.01)
        await broker.close()
    assert mode_of(Path(wakeup.directory_for(str(db)))) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
async def test_another_users_wake_directory_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, wake = open_wake_directory(tmp_path)
    planted = receiver(wake / "999999.0")  # the other user's socket
    os.chown(planted.getsockname(), OTHER_UID, OTHER_UID)
    os.chown(wake, OTHER_UID, OTHER_UID)
    broker = SQLiteBroker(str(db))
    try:
        with caplog.at_level(logging.WARNING, "durq.sqlite"):
            await broker.enqueue(task())
            # Served by the poll: no socket of ours goes into that directory.
            assert await broker.wait_for_work(["q"], 0.05)
        assert_nothing_received(planted)
        assert [p.name for p in wake.iterdir()] == ["999999.0"]
        assert f"belongs to uid {OTHER_UID}" in caplog.text
    finally:
        await broker.close()
        planted.close()
    assert wake.stat().st_uid == OTHER_UID  # not taken over either


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a socket to another user needs root")
async def test_another_users_socket_in_our_directory_gets_nothing(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    wake = Path(wakeup.directory_for(str(db)))
    wake.mkdir(mode=0o700)
    planted = receiver(wake / "999999.0")
    os.chown(planted.getsockname(), OTHER_UID, OTHER_UID)
    try:
        await enqueue_once(db)
        assert_nothing_received(planted)
    finally:
        planted.close()


def test_a_refused_socket_is_removed_only_if_it_is_one(tmp_path: Path) -> None:
    wake = tmp_path / "db.wake"
    wake.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(wake / "999999.0"))
    dead.close()  # its process died: the sender removes it
    sender = wakeup.Sender(str(wake))
    try:
        sender.send({"q"})
    finally:
        sender.close()
    assert list(wake.iterdir()) == []


# ---------------------------------------------------------------- datagrams


def test_malformed_datagrams_are_ignored_whole() -> None:
    assert wakeup.parse(b"a\nb") == {"a", "b"}
    for junk in (b"", b"\xff\xfe", b"q\n", b"q\nnot a queue", b"q\n\x00", "q\né".encode()):
        assert wakeup.parse(junk) is None, junk


async def test_a_flood_is_read_a_bounded_number_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wakeup, "MAX_DRAIN", 4, raising=False)
    db = tmp_path / "durq.sqlite3"
    # A poll far longer than the test: the budget of reads does not come back meanwhile.
    broker = SQLiteBroker(str(db), poll_interval=3600.0)
    await broker.connect()
    waiting = asyncio.create_task(broker.wait_for_work(["q"], 3600.0))
    wake = Path(wakeup.directory_for(str(db)))
    while not (wake.is_dir() and any(wake.iterdir())):
        await asyncio.sleep(0.01)
    (path,) = wake.iterdir()
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    flood.setblocking(False)
    sent = 0
    try:
        while True:
            flood.sendto(b"\xffgarbage\x00", str(path))  # as fast as the buffer takes them
            sent += 1
    except BlockingIOError:
        pass
    finally:
        flood.close()
    assert sent > 4, "the socket buffer holds fewer datagrams than the test needs"
    listener = broker._storage.listener
    for _ in range(50):  # let the event loop serve the socket for a while
        await asyncio.sleep(0.01)
    assert not waiting.done()  # garbage wakes nobody
    waiting.cancel()
    # Four read and ignored, then the socket was left alone: the rest still waits there.
    assert listener.sock is not None
    left = 0
    while True:
        try:
            listener.sock.recv(wakeup.MAX_DATAGRAM)
            left += 1
        except BlockingIOError:
            break
    await broker.close()
    assert left == sent - 4
    assert (listener.received, listener.ignored, listener.floods) == (4, 4, 1)


# A waiter in its own process that claims the task once woken (by datagram or poll) and
# prints what its listener read.
WAITER = """
import asyncio, json, sys, time
from durq.brokers.base import ClaimParams
from durq.brokers.sqlite import SQLiteBroker

async def main():
    broker = SQLiteBroker(sys.argv[1], poll_interval=float(sys.argv[2]))
    await broker.connect()
    await broker.wait_for_work(["q"], 0.01)
    print("ready", flush=True)
    started = time.monotonic()
    leases = []
    while not leases:
        await broker.wait_for_work(["q"], 60)
        leases = await broker.claim(ClaimParams(["q"], 1, "w", 30.0))
    listener = broker._storage.listener
    print(json.dumps({
        "claimed": leases[0].task.id,
        "seconds": time.monotonic() - started,
        "received": listener.received,
        "ignored": listener.ignored,
        "most_in_one_drain": listener.most_in_one_drain,
    }), flush=True)
    await broker.close()

asyncio.run(main())
"""

# Sends garbage to every socket of a directory as fast as it can; says when a given number
# of datagrams went through.
FLOODER = """
import os, socket, sys
directory, enough = sys.argv[1], int(sys.argv[2])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.setblocking(False)
targets = [os.path.join(directory, n) for n in os.listdir(directory)]
sent = 0
while True:
    for path in targets:
        try:
            sock.sendto(os.urandom(64), path)
            sent += 1
        except OSError:
            continue
        if sent == enough:
            print("flooding", flush=True)
"""


def test_a_flooded_worker_still_claims_and_reads_within_its_budget(tmp_path: Path) -> None:
    db = tmp_path / "durq.sqlite3"
    poll = 0.2
    asyncio.run(enqueue_nothing(db))
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER, str(db), str(poll)], stdout=subprocess.PIPE, text=True
    )
    flooder: subprocess.Popen[str] | None = None
    try:
        assert waiter.stdout is not None
        assert waiter.stdout.readline().strip() == "ready"
        enough = 3 * wakeup.MAX_DRAIN
        flooder = subprocess.Popen(
            [sys.executable, "-c", FLOODER, wakeup.directory_for(str(db)), str(enough)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flooder.stdout is not None
        assert flooder.stdout.readline().strip() == "flooding"
        asyncio.run(enqueue_once(db))
        out, _ = waiter.communicate(timeout=60)
    finally:
        waiter.kill()
        if flooder is not None:
            flooder.kill()
            flooder.wait()
    report = json.loads(out)
    assert report["claimed"] == "t1"
    # Every datagram but the real wake-up was garbage, and ignored.
    assert report["ignored"] >= report["received"] - 1
    # Read within the budget: MAX_DRAIN per poll interval (one window at each end).
    windows = report["seconds"] / poll + 2
    assert report["received"] <= wakeup.MAX_DRAIN * windows
    assert report["most_in_one_drain"] <= wakeup.MAX_DRAIN


# ---------------------------------------------------------------- the database files


def sqlite_files(db: Path) -> dict[str, int]:
    return {
        p.name: mode_of(p)
        for p in db.parent.iterdir()
        if p.name.startswith(db.name) and p.is_file()
    }


async def test_database_files_are_created_0600(tmp_path: Path, umask_022: None) -> None:
    db = tmp_path / "durq.sqlite3"
    broker = SQLiteBroker(str(db))
    await broker.enqueue(task())  # open: the -wal and -shm exist now
    try:
        modes = sqlite_files(db)
    finally:
        await broker.close()
    assert modes == {
        "durq.sqlite3": 0o600,
        "durq.sqlite3-wal": 0o600,
        "durq.sqlite3-shm": 0o600,
    }
    # A rollback journal (another program opening the file without WAL) follows the file.
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE app_table (x)")
        assert mode_of(tmp_path / "durq.sqlite3-journal") == 0o600
        conn.execute("COMMIT")
    conn.close()


@pytest.mark.parametrize("option", ["0640", "640", "0o640"])
async def test_file_mode_sets_the_mode_of_created_files(tmp_path: Path, option: str) -> None:
    db = tmp_path / "shared.sqlite3"
    with umask(0o077):  # the mode asked for wins over the umask
        broker = open_broker(f"sqlite:///{db}?file_mode={option}")
        await broker.enqueue(task())
        modes = sqlite_files(db)
        await broker.close()
    assert set(modes.values()) == {0o640}
    assert len(modes) == 3


@pytest.mark.parametrize("option", ["0700", "0400", "0644x", "999", "01666", "0", "-600"])
def test_file_mode_out_of_range_is_a_clear_error(tmp_path: Path, option: str) -> None:
    with pytest.raises(ConfigurationError, match="file_mode") as caught:
        SQLiteBroker.from_url(f"sqlite:///{tmp_path}/x.db?file_mode={option}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("mode", [0o700, 0o4600, 0o200, 0o1666])
def test_file_mode_argument_is_checked(tmp_path: Path, mode: int) -> None:
    with pytest.raises(ConfigurationError, match="0600"):
        SQLiteBroker(str(tmp_path / "x.db"), file_mode=mode)


async def test_an_existing_open_database_is_kept_and_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "old.sqlite3"
    sqlite3.connect(db).close()
    db.chmod(0o644)
    broker = SQLiteBroker(str(db))
    with caplog.at_level(logging.WARNING, "durq.sqlite"):
        await broker.connect()
    await broker.close()
    assert mode_of(db) == 0o644  # another user's process may share it on purpose
    assert "mode 0644, more open than file_mode 0600" in caplog.text
    assert f"chmod 600 {db}" in caplog.text


async def test_an_existing_database_no_more_open_than_file_mode_is_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "ok.sqlite3"
    sqlite3.connect(db).close()
    db.chmod(0o640)
    broker = SQLiteBroker(str(db), file_mode=0o640)
    with caplog.at_level(logging.WARNING, "durq.sqlite"):
        await broker.connect()
    await broker.close()
    assert "more open" not in caplog.text
