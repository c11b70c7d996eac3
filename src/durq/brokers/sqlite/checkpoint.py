"""WAL checkpoints in the background, off the enqueue/claim/ack path.

In WAL mode SQLite copies the log back into the database file (a checkpoint) from inside the
commit that pushes the log past ``wal_autocheckpoint`` pages: that caller pays for copying up
to ~4 MB and two fsyncs, a stall of 5-15 ms about every few hundred commits. A
:class:`Checkpointer` runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own thread and connection
shortly after commits (pokes within ``delay`` share one checkpoint), so the log rarely reaches
the threshold and callers rarely checkpoint. A passive checkpoint never waits for readers or
writers; one that finds another connection checkpointing simply reports busy. The automatic
checkpoint stays as the backstop that keeps the log bounded should this thread fall behind.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping

#: How long after a commit the checkpoint runs: commits meanwhile share it.
DEFAULT_DELAY = 0.05
#: At most this many checkpoints in a row to catch up with commits made meanwhile.
MAX_PASSES = 4


class Checkpointer:
    """One thread and one connection that checkpoint ``path`` after :meth:`poke` calls.

    The thread starts with the first poke and ends with :meth:`close`."""

    def __init__(
        self, path: str, queries: Mapping[str, str], *, delay: float = DEFAULT_DELAY
    ) -> None:
        self.path = path
        self.statements = queries  # the package's named statements (queries.sql)
        self.delay = delay
        #: ``(busy, log frames, checkpointed frames)`` of the last checkpoint, for tests.
        self.last: tuple[int, int, int] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """A commit happened: checkpoint within ``delay``."""
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(
                        target=self._run, name="durq-sqlite-checkpoint", daemon=True
                    )
                    self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread and close its connection (idempotent; waits for a running
        checkpoint to finish)."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:  # a storage reopened after close() starts a new thread
            self._thread = None
            self._stop.clear()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while not self._stop.is_set():
                self._wake.wait()
                self._wake.clear()  # before the stop check: close() sets stop, then wake
                if self._stop.wait(self.delay):
                    return
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, isolation_level=None)
                        conn.execute(self.statements["synchronous_normal"])
                    self._checkpoint(conn)
                except sqlite3.Error:
                    pass  # e.g. locked by a migration: the next commit asks again
        finally:
            if conn is not None:
                conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """Checkpoint, then again while commits made during the last pass added frames: the
        next writer restarts the log from its start only if it finds it copied to the end,
        which keeps the log short and away from the automatic checkpoint's threshold."""
        previous = -1
        for _ in range(MAX_PASSES):
            row = conn.execute(self.statements["wal_checkpoint"]).fetchone()
            self.last = busy, frames, copied = int(row[0]), int(row[1]), int(row[2])
            if busy or copied < frames or frames == previous or self._stop.is_set():
                return
            previous = frames
