"""Wake-ups between processes on one machine: Unix datagram sockets next to the database.

A broker that waits for work binds one socket in ``<database>.wake/`` (named
``<pid>.<n>``); a broker that commits a write making tasks claimable sends one tiny datagram
(the queue names) to every socket there, after the commit, non-blocking, errors ignored.
The ``PRAGMA data_version`` poll stays underneath: a lost datagram, a removed directory or a
platform without ``AF_UNIX`` datagrams costs latency, never a task.

The sender caches the directory listing for :data:`LISTING_TTL` seconds, so an enqueue
with nobody listening makes no system call; a socket whose process died is removed by the
first sender that is refused by it.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import sys
import threading
import time

log = logging.getLogger("durq.sqlite")

#: How long a sender trusts its listing of the socket directory (a new listener may miss
#: wake-ups for that long, and is then served by the poll).
LISTING_TTL = 1.0
#: Longer datagrams are not sent (the poll serves them): far above any real queue list.
MAX_DATAGRAM = 8192
#: Linux and macOS have ``AF_UNIX`` datagram sockets; elsewhere only the poll runs.
SUPPORTED = hasattr(socket, "AF_UNIX") and sys.platform != "win32"
# Linux allows 108 bytes of socket path, macOS 104.
_MAX_PATH = 100
_counter = itertools.count()


def directory_for(db_path: str) -> str:
    """The socket directory of a database file."""
    return db_path + ".wake"


class Listener:
    """This broker's socket: bound on first use, readable while ``wait_for_work`` runs."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.sock: socket.socket | None = None
        self.path: str | None = None
        self._failed = False

    def open(self) -> socket.socket | None:
        """The bound, non-blocking socket; ``None`` where the channel cannot be had."""
        if self.sock is not None or self._failed or not SUPPORTED:
            return self.sock
        path = os.path.join(self.directory, f"{os.getpid()}.{next(_counter)}")
        if len(os.fsencode(path)) > _MAX_PATH:
            self._give_up(f"socket path longer than {_MAX_PATH} bytes: {path}")
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            os.makedirs(self.directory, exist_ok=True)
            sock.bind(path)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            self._give_up(f"{exc}")
            return None
        self.sock, self.path = sock, path
        return sock

    def _give_up(self, why: str) -> None:
        self._failed = True
        log.info("cross-process wake-ups off for %s (%s): polling instead", self.directory, why)

    def drain(self) -> set[str] | None:
        """Every queue named by the datagrams waiting; ``None`` if none came."""
        if self.sock is None:
            return None
        queues: set[str] | None = None
        while True:
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except OSError:  # nothing more to read (BlockingIOError) or a closed socket
                return queues
            if queues is None:
                queues = set()
            queues.update(q for q in data.decode("utf-8", "replace").split("\n") if q)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is None:
            return
        sock.close()
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class Sender:
    """Sends the wake-ups of one broker; safe to call from any thread."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._listing: list[str] = []
        self._listed_at = float("-inf")
        self._own = f"{os.getpid()}."

    def _targets(self) -> list[str]:
        now = time.monotonic()
        if now - self._listed_at < LISTING_TTL:
            return self._listing
        try:
            names = os.listdir(self.directory)
        except OSError:
            names = []
        # This process's brokers are woken in-process (the mailbox registry).
        self._listing = [
            os.path.join(self.directory, n) for n in names if not n.startswith(self._own)
        ]
        self._listed_at = now
        return self._listing

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
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
