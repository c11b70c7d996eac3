"""Wake-ups between processes on one machine: Unix datagram sockets next to the database.

A broker that waits for work binds one socket in ``<database>.wake/`` (named
``<pid>.<n>``); a broker that commits a write making tasks claimable sends one tiny datagram
(the queue names) to every socket there, after the commit, non-blocking, errors ignored.
The ``PRAGMA data_version`` poll stays underneath: a lost datagram, a removed directory or a
platform without ``AF_UNIX`` datagrams costs latency, never a task.

The sender caches the directory listing for :data:`LISTING_TTL` seconds, so an enqueue
with nobody listening makes no system call; a socket whose process died is removed by the
first sender that is refused by it.

Whoever can write in the directory decides where the queue names go and what a sender
unlinks, so it is trusted only as this process's user made it: a real directory (never a
symlink) owned by that user, mode 0700 (a looser one of ours is tightened). Inside, only
this user's sockets are sent to or removed, looked at without following links. A flood of
datagrams costs a listener at most :data:`MAX_DRAIN` reads per turn of its event loop.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import socket
import stat
import sys
import threading
import time

from durq.errors import InvalidNameError, UnsafeFileError
from durq.names import check_queue

log = logging.getLogger("durq.sqlite")

#: How long a sender trusts its listing of the socket directory (a new listener may miss
#: wake-ups for that long, and is then served by the poll).
LISTING_TTL = 1.0
#: Longer datagrams are not sent (the poll serves them): far above any real queue list.
MAX_DATAGRAM = 8192
#: The most datagrams a listener reads per window (its broker's poll interval, which
#: serves meanwhile): more is a flood, or a burst no waiter needs (the first one woke it),
#: left to the kernel, which drops what its buffer cannot hold.
MAX_DRAIN = 64
#: Linux and macOS have ``AF_UNIX`` datagram sockets; elsewhere only the poll runs.
SUPPORTED = hasattr(socket, "AF_UNIX") and sys.platform != "win32"
# Linux allows 108 bytes of socket path, macOS 104.
_MAX_PATH = 100
_counter = itertools.count()


def directory_for(db_path: str) -> str:
    """The socket directory of a database file."""
    return db_path + ".wake"


def refuse_links(directory: str) -> bool:
    """Whether ``directory`` exists; raises :class:`UnsafeFileError` if it is a symlink or
    not a directory (never made by durq: a mistake or an attack, to be fixed by hand)."""
    return _lstat(directory) is not None


def check_directory(directory: str) -> bool:
    """Whether ``directory`` exists, once it is known to be one this process may trust: a
    real directory of this process's user, mode 0700 (a looser one is tightened and
    logged). Raises :class:`UnsafeFileError` (saying what to do) for a symlink, another
    kind of file, or another user's directory."""
    fd = _open_trusted(directory)
    if fd is None:
        return False
    os.close(fd)
    return True


def _lstat(directory: str) -> os.stat_result | None:
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise UnsafeFileError(
            f"{directory} is {what}: durq keeps its wake-up sockets there and uses only a "
            "plain directory of this process's user; remove it (durq recreates it, mode 0700)"
        )
    return st


def _check_owner(directory: str, uid: int) -> None:
    if uid != os.geteuid():
        raise UnsafeFileError(
            f"{directory} belongs to uid {uid}, not to this process's user "
            f"(uid {os.geteuid()}): durq's wake-up sockets live there, so run every "
            "process on this database as one user, or remove the directory (durq "
            "recreates it, mode 0700)"
        )


def _open_trusted(directory: str) -> int | None:
    """A descriptor of ``directory`` once checked as :func:`check_directory` says, opened
    without following a symlink (so what is checked is what is used); ``None`` if it does
    not exist."""
    st = _lstat(directory)
    if st is None:
        return None
    _check_owner(directory, st.st_uid)  # before opening: another user's may be unreadable
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced since the look above
            raise UnsafeFileError(f"{directory} changed while durq opened it: {exc}") from exc
        raise
    try:
        st = os.fstat(fd)
        _check_owner(directory, st.st_uid)
        if stat.S_IMODE(st.st_mode) & 0o077:
            # Ours but open to others (made by an older durq with the umask, or by hand):
            # another user may have put sockets or links there meanwhile, which the
            # listing skips (see _sockets).
            os.fchmod(fd, 0o700)
            log.warning(
                "tightened %s from mode %04o to 0700 (durq's wake-up sockets)",
                directory,
                stat.S_IMODE(st.st_mode),
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sockets(directory: str) -> tuple[list[str], list[str]]:
    """The names of this user's sockets in ``directory``, and of the other entries (links,
    files, other users' sockets), each looked at without following links."""
    fd = _open_trusted(directory)
    if fd is None:
        return [], []
    mine: list[str] = []
    others: list[str] = []
    uid = os.geteuid()
    try:
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # its listener closed meanwhile
            if stat.S_ISSOCK(st.st_mode) and st.st_uid == uid:
                mine.append(name)
            else:
                others.append(name)
    finally:
        os.close(fd)
    return mine, others


def _unlink_socket(path: str) -> None:
    """Remove ``path`` if it is (still) a socket: never a file, a link or what it points to."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass


def parse(data: bytes) -> set[str] | None:
    """The queue names of a datagram, or ``None`` if it is not one a sender writes (valid
    queue names, one per line): such a datagram is ignored whole."""
    try:
        names = data.decode("ascii").split("\n")
        for name in names:
            check_queue(name)
    except (UnicodeDecodeError, InvalidNameError):
        return None
    return set(names)


class Listener:
    """This broker's socket: bound on first use, readable while ``wait_for_work`` runs.

    It reads at most :data:`MAX_DRAIN` datagrams per ``window`` seconds."""

    def __init__(self, directory: str, *, window: float = 0.025) -> None:
        self.directory = directory
        self.window = window
        self._window_start = float("-inf")
        self._window_reads = 0
        self.sock: socket.socket | None = None
        self.path: str | None = None
        self._failed = False
        #: Whether the last :meth:`drain` stopped at the bound (more may wait): read again
        #: after :meth:`resume_in`.
        self.flooded = False
        #: Datagrams read, those ignored as malformed, the most read by one drain, and the
        #: drains that stopped at the bound (for tests and debugging).
        self.received = 0
        self.ignored = 0
        self.most_in_one_drain = 0
        self.floods = 0

    def open(self) -> socket.socket | None:
        """The bound, non-blocking socket; ``None`` where the channel cannot be had."""
        if self.sock is not None or self._failed or not SUPPORTED:
            return self.sock
        path = os.path.join(self.directory, f"{os.getpid()}.{next(_counter)}")
        if len(os.fsencode(path)) > _MAX_PATH:
            self._give_up(f"socket path longer than {_MAX_PATH} bytes: {path}")
            return None
        try:
            os.mkdir(self.directory, 0o700)
        except FileExistsError:
            pass  # checked below like any other
        except OSError as exc:
            self._give_up(f"{exc}")
            return None
        try:
            check_directory(self.directory)
        except UnsafeFileError as exc:
            self._give_up(exc.message, level=logging.WARNING)
            return None
        except OSError as exc:
            self._give_up(f"{exc}")
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            self._give_up(f"{exc}")
            return None
        self.sock, self.path = sock, path
        return sock

    def _give_up(self, why: str, *, level: int = logging.INFO) -> None:
        self._failed = True
        log.log(
            level, "cross-process wake-ups off for %s (%s): polling instead", self.directory, why
        )

    def drain(self) -> set[str] | None:
        """The queues named by the datagrams waiting, as many as the window's budget allows
        (:attr:`flooded` tells whether it stopped there); ``None`` if no valid one came.
        Malformed datagrams are counted and ignored."""
        self.flooded = False
        if self.sock is None:
            return None
        now = time.monotonic()
        if now - self._window_start >= self.window:
            self._window_start, self._window_reads = now, 0
        budget = MAX_DRAIN - self._window_reads
        queues: set[str] | None = None
        read = 0
        try:
            while read < budget:
                try:
                    data = self.sock.recv(MAX_DATAGRAM)
                except OSError:  # nothing more to read (BlockingIOError) or a closed socket
                    return queues
                read += 1
                names = parse(data)
                if names is None:
                    self.ignored += 1
                elif queues is None:
                    queues = names
                else:
                    queues |= names
            self.flooded = True
            self.floods += 1
            return queues
        finally:
            self.received += read
            self._window_reads += read
            self.most_in_one_drain = max(self.most_in_one_drain, read)

    def resume_in(self) -> float:
        """Seconds until the budget of reads comes back (the window ends)."""
        return max(0.0, self._window_start + self.window - time.monotonic())

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is None:
            return
        sock.close()
        if self.path is not None:
            _unlink_socket(self.path)


class Sender:
    """Sends the wake-ups of one broker; safe to call from any thread."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._listing: list[str] = []
        self._listed_at = float("-inf")
        self._own = f"{os.getpid()}."
        self._warned: set[str] = set()  # what was logged once already

    def _targets(self) -> list[str]:
        now = time.monotonic()
        if now - self._listed_at < LISTING_TTL:
            return self._listing
        try:
            names, others = _sockets(self.directory)
        except UnsafeFileError as exc:
            self._warn_once(self.directory, f"not sending wake-ups: {exc.message}")
            names, others = [], []
        except OSError:  # e.g. another user's directory we may not read
            names, others = [], []
        for name in others:
            path = os.path.join(self.directory, name)
            self._warn_once(path, f"not sending wake-ups to {path}: not a socket of this user")
        # This process's brokers are woken in-process (the mailbox registry).
        self._listing = [
            os.path.join(self.directory, n) for n in names if not n.startswith(self._own)
        ]
        self._listed_at = now
        return self._listing

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", text)

    def send(self, queues: set[str] | frozenset[str]) -> None:
        """Tell every listening process that ``queues`` may have work (after a commit)."""
        if not SUPPORTED or not queues:
            return
        with self._lock:
            targets = self._targets()
            if not targets:
                return
            data = "\n".join(sorted(queues)).encode()
            if len(data) > MAX_DATAGRAM:
                return
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            gone: list[str] = []
            for path in targets:
                try:
                    self._sock.sendto(data, path)
                except (BlockingIOError, InterruptedError):
                    pass  # its buffer is full: it has wake-ups pending already
                except (ConnectionRefusedError, FileNotFoundError):
                    gone.append(path)  # its process died (or closed): forget the socket
                except OSError:
                    pass
            if gone:
                self._listing = [p for p in targets if p not in gone]
                for path in gone:
                    _unlink_socket(path)

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
