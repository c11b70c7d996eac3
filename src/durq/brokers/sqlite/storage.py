"""Plumbing of the SQLite broker: one database thread per broker, transactions, schema, errors.

Python's ``sqlite3`` blocks, so calls run in a single-thread executor that owns the
connection: calls of one broker are serialised, and the event loop never waits for a lock.
The short calls of a worker's task path (a claim, an ack, a lease extension, a wake-up look)
run on the caller's thread instead when the connection is free, with no lock wait allowed
there: one that meets another connection's lock starts again on the database thread, which
waits.
Write transactions start with ``BEGIN IMMEDIATE``: the write lock is taken up front, so two
processes never interleave a read-then-write (claim) and nobody hits a mid-transaction BUSY.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

from durq import ranges
from durq.brokers import dependencies, limiter, mailbox, sqlfiles
from durq.brokers.base import (
    EnqueueParams,
    GroupParams,
    MemberOutcome,
    check_distinct,
    fan_in_payload,
    follow_up_from,
    minute_of,
    waiting_follow_up,
)
from durq.brokers.params import WorkflowParams
from durq.brokers.sqlite import files, wakeup
from durq.brokers.sqlite.checkpoint import Checkpointer
from durq.brokers.sqlite.errors import map_error
from durq.brokers.sqlite.timeline import Timeline
from durq.brokers.sqlrows import row_to_info
from durq.clock import SYSTEM_CLOCK, Clock, utc_day
from durq.errors import (
    BrokerUnavailableError,
    DuplicateTaskError,
    DurqError,
    SchemaError,
    TaskIDConflictError,
)
from durq.states import TaskState
from durq.task import TaskInfo, fair_spec, limits_from_json, limits_to_json

T = TypeVar("T")
Conn = sqlite3.Connection
#: What statements run on: our connection, or a cursor on a caller's connection (E8).
Exec = sqlite3.Connection | sqlite3.Cursor

#: Every named statement of ``queries.sql``.
STATEMENTS: dict[str, str] = sqlfiles.load_queries(__package__)
#: Every migration, in version order.
MIGRATIONS: tuple[sqlfiles.Migration, ...] = sqlfiles.load_migrations(__package__)
#: The schema version this code expects.
SCHEMA_VERSION: int = MIGRATIONS[-1].version

#: How long a writer waits for another connection's write lock before giving up.
DEFAULT_BUSY_TIMEOUT = 5.0
#: How often an idle ``wait_for_work`` looks for commits of other processes.
DEFAULT_POLL_INTERVAL = 0.025


def transaction(conn: Conn, fn: Callable[[Conn], T]) -> T:
    """Run ``fn`` in a write transaction (``BEGIN IMMEDIATE``); roll back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


class _Busy(Exception):
    """A call that may not wait met another connection's lock (see ``SQLiteStorage.call``)."""


def _busy(exc: sqlite3.Error) -> bool:
    """Another connection holds a lock ``exc``'s statement needed (SQLITE_BUSY and its
    extended codes)."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY


def _set_busy_timeout(conn: Conn, ms: int) -> None:
    # A PRAGMA takes no parameters: the value is an int computed here, never input.
    conn.execute(f"PRAGMA busy_timeout = {ms:d}")


def join_write_lock(cursor: sqlite3.Cursor) -> None:
    """In a caller's open transaction, ask for the write lock before anything reads: SQLite
    waits (busy timeout) for a lock asked first, but refuses at once a transaction that has
    read and then wants to write. A file without durq tables is left to the schema check."""
    if not cursor.connection.in_transaction:
        return  # Python's implicit BEGIN comes with the first write, which waits anyway
    try:
        cursor.execute(STATEMENTS["take_write_lock"])
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise


def snapshot(conn: Conn, fn: Callable[[Conn], T]) -> T:
    """Run several reads against one consistent snapshot (a deferred read transaction)."""
    conn.execute("BEGIN")
    try:
        return fn(conn)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


class SQLiteStorage:
    """The database thread, the connection, the schema, and the writes the hot path and the
    inspector share. :class:`~durq.brokers.sqlite.broker.SQLiteBroker` and
    :class:`~durq.brokers.sqlite.admin.SQLiteAdmin` both work on one of these."""

    def __init__(
        self,
        path: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        file_mode: int = files.DEFAULT_FILE_MODE,
    ) -> None:
        self.path = os.path.abspath(path)
        self.clock = clock
        #: The mode of the database files this broker creates (see files.py).
        self.file_mode = files.check_file_mode(file_mode)
        #: Leases on the machine's monotonic clock; steps of the wall clock noticed.
        self.timeline = Timeline(clock)
        self.busy_timeout = ranges.seconds("busy_timeout", busy_timeout)
        self.poll_interval = ranges.seconds("poll_interval", poll_interval, positive=True)
        # Key of the in-process wake-up registry: every broker on this file shares it.
        self.key = os.path.realpath(self.path)
        self.mailbox = mailbox.register(self.key)
        # data_version when this broker last looked for work (claim or wake-up): a change
        # since then means another connection committed, maybe an enqueue.
        self.seen_version: int | None = None
        # Other processes: datagrams through the sockets next to the file (see wakeup.py).
        self.wake_dir = wakeup.directory_for(self.key)
        self.listener = wakeup.Listener(self.wake_dir, window=poll_interval)
        self.sender = wakeup.Sender(self.wake_dir)
        # Copies the WAL back into the file after commits, off the callers' path.
        self.checkpointer = Checkpointer(self.path, STATEMENTS)
        self._watchers = 0
        self._watch_loop: asyncio.AbstractEventLoop | None = None
        self._watch_fd = -1
        # While a flood of datagrams is left unread (see _on_datagram): its resumption.
        self._paused: asyncio.TimerHandle | None = None
        self._executor: ThreadPoolExecutor | None = None
        # The sync face may call from several threads: one executor, hence one connection.
        self._executor_lock = threading.Lock()
        # Held by whichever thread uses the connection: the database thread, or a caller
        # running a short call inline (see call()).
        self._conn_lock = threading.Lock()
        self._conn: Conn | None = None
        self._waits = True  # the connection's busy timeout is on (see _wait_for_locks)
        self._applied: list[str] = []

    # ------------------------------------------------------------------ calls

    async def call(self, operation: str, fn: Callable[[Conn], T], *, inline: bool = False) -> T:
        """Run ``fn(connection)`` on the database thread, opening the connection if needed.

        ``inline``: ``fn`` is short and can start again from the beginning (reads, then at
        most one write transaction). It then runs on the calling thread when the connection
        is open and idle, without waiting for any lock: a lock held by another connection
        sends it to the database thread, where it waits up to the busy timeout as usual."""
        # A hop to the database thread and back costs about as much CPU as a claim's SQL
        # (the worker's CPU per task sent alone, docs/benchmarks.md).
        if inline and self._conn is not None and self._conn_lock.acquire(blocking=False):
            try:
                if self._conn is not None:  # not closed meanwhile
                    return self._run(operation, fn, wait=False)
            except _Busy:
                pass  # another connection's lock: wait for it on the database thread
            finally:
                self._conn_lock.release()
        executor = self._executor
        if executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="durq-sqlite")
                executor = self._executor
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self._job, operation, fn)

    async def write(
        self, operation: str, fn: Callable[[Conn, float], T], *, inline: bool = False
    ) -> T:
        """``fn(conn, now)`` inside one ``BEGIN IMMEDIATE`` transaction (see
        :meth:`transaction` for ``now``; :meth:`call` for ``inline``)."""
        return await self.call(operation, lambda conn: self.transaction(conn, fn), inline=inline)

    def transaction(self, conn: Conn, fn: Callable[[Conn, float], T]) -> T:
        """``fn(conn, now)`` in a write transaction that first catches up with a step of the
        wall clock (see :class:`~durq.brokers.sqlite.timeline.Timeline`). ``now`` is the wall
        clock read then, under the write lock: a moment read before the lock may predate a
        step another process has meanwhile applied to the stored moments."""
        result = transaction(conn, lambda c: fn(c, self.timeline.check(c, STATEMENTS)))
        self.timeline.settle()
        self.checkpointer.poke()
        return result

    async def write_waking(
        self,
        operation: str,
        fn: Callable[[Conn, float, set[str]], T],
        *,
        inline: bool = False,
    ) -> T:
        """``fn(conn, now, woken)`` inside one transaction; once it committed, wake the
        waiters of the queues ``fn`` put in ``woken`` (a waiter woken earlier would find
        nothing)."""
        woken: set[str] = set()
        result = await self.write(operation, lambda conn, now: fn(conn, now, woken), inline=inline)
        self.notify(woken)
        return result

    async def read(self, operation: str, fn: Callable[[Conn], T]) -> T:
        """``fn`` against one consistent snapshot."""
        return await self.call(operation, lambda conn: snapshot(conn, fn))

    def _job(self, operation: str, fn: Callable[[Conn], T]) -> T:
        with self._conn_lock:
            return self._run(operation, fn, wait=True)

    def _run(self, operation: str, fn: Callable[[Conn], T], *, wait: bool) -> T:
        """``fn`` on the connection (opened if needed), which the caller holds. ``wait``:
        for other connections' locks, up to the busy timeout; else their lock raises
        :class:`_Busy` before ``fn`` wrote anything."""
        try:
            conn = self._conn if self._conn is not None else self._open(operation)
            self._wait_for_locks(conn, wait)
            return fn(conn)
        except DurqError:
            raise
        except sqlite3.Error as exc:
            if not wait and _busy(exc):
                raise _Busy from exc
            raise self.map_error(exc, operation) from exc

    def _wait_for_locks(self, conn: Conn, wait: bool) -> None:
        """Let ``conn`` wait for other connections' locks up to the busy timeout, or not at
        all (a call on the event loop's thread must not block it)."""
        if wait != self._waits:
            _set_busy_timeout(conn, int(self.busy_timeout * 1000) if wait else 0)
            self._waits = wait

    def map_error(self, exc: sqlite3.Error, operation: str, *, caller: bool = False) -> DurqError:
        """The durq error for a driver error of ``operation``; ``caller``: it happened in the
        caller's transaction (E8), whose connection has its own busy timeout."""
        return map_error(exc, operation, self.path, self.busy_timeout, caller=caller)

    # ------------------------------------------------------------------ connection and schema

    def _open(self, operation: str) -> Conn:
        """Open the connection, set its pragmas and bring the schema up to date (embedded:
        nothing to install, so connecting migrates; a newer schema is refused). A symlink
        where the wake-up directory goes is refused (UnsafeFileError) before anything."""
        wakeup.refuse_links(self.wake_dir)
        files.create(self.path, self.file_mode)
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # autocommit: transactions are explicit BEGIN/COMMIT
                check_same_thread=False,  # the executor thread owns it; close() may differ
            )
        except sqlite3.Error as exc:
            raise BrokerUnavailableError(
                f"cannot open SQLite database {self.path}: {exc}", operation=operation
            ) from exc
        try:
            conn.row_factory = sqlite3.Row
            _set_busy_timeout(conn, int(self.busy_timeout * 1000))
            self._waits = True
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise BrokerUnavailableError(
                    f"SQLite database {self.path} cannot use WAL mode (got {mode!r})",
                    operation=operation,
                )
            # WAL + NORMAL: a commit is atomic and durable across process crashes; only an OS
            # crash or power loss may drop the last transactions (never corrupts the file).
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._applied.extend(self._migrate(conn, operation))
        except sqlite3.OperationalError as exc:
            conn.close()  # e.g. migrating waited for the write lock beyond the budget
            raise self.map_error(exc, operation) from exc
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise BrokerUnavailableError(
                f"{self.path} is not a usable SQLite database: {exc}", operation=operation
            ) from exc
        except BaseException:
            conn.close()
            raise
        # Only once the file proved to be a database: a wrong path gets one error, not two.
        files.warn_if_open(self.path, self.file_mode)
        self._conn = conn
        return conn

    def _migrate(self, conn: Conn, operation: str) -> list[str]:
        """Apply the missing migrations in one immediate transaction (safe across processes).

        Missing means not recorded, not only newer than the latest recorded: a number held
        by a migration of another branch (a gap, see :func:`~durq.brokers.sqlfiles.
        load_migrations`) is applied once it exists, as on PostgreSQL."""
        applied = applied_versions(conn)
        self._check_version(max(applied, default=0), operation)
        if all(m.version in applied for m in MIGRATIONS):
            return []

        def apply(c: Conn) -> list[str]:
            c.execute(STATEMENTS["migrations_table"])
            applied = applied_versions(c)  # another process may have migrated meanwhile
            self._check_version(max(applied, default=0), operation)
            done: list[str] = []
            for migration in MIGRATIONS:
                if migration.version in applied:
                    continue
                for statement in split_statements(migration.sql):
                    c.execute(statement)
                c.execute(
                    STATEMENTS["record_migration"],
                    {
                        "version": migration.version,
                        "name": migration.file,
                        "now": self.clock.now(),
                    },
                )
                done.append(migration.file)
            return done

        return transaction(conn, apply)

    def _check_version(self, version: int, operation: str) -> None:
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"SQLite database {self.path} is at schema version {version}, newer than this "
                f"durq ({SCHEMA_VERSION}): upgrade durq",
                operation=operation,
            )

    def _close_conn(self) -> None:
        self.checkpointer.close()
        with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def connect(self) -> None:
        """Open the connection and migrate the schema if needed (idempotent).

        Raises BrokerUnavailableError (unreachable path, not a database) or SchemaError
        (a schema newer than this code)."""
        await self.call("sqlite.connect", lambda conn: None)

    async def migrate(self) -> list[str]:
        """Apply missing migrations; returns the names applied by this call."""

        def run(conn: Conn) -> list[str]:
            applied = self._applied + self._migrate(conn, "sqlite.migrate")
            self._applied = []
            return applied

        return await self.call("sqlite.migrate", run)

    async def pending_migrations(self) -> list[str]:
        """The migrations :meth:`migrate` would apply, read on a read-only connection of
        its own (this broker's connection migrates as it opens); a missing file is not
        created and needs them all."""

        def read() -> int:
            if not os.path.exists(self.path):
                return 0
            conn = sqlite3.connect(f"{pathlib.Path(self.path).as_uri()}?mode=ro", uri=True)
            try:
                version = schema_version(conn)
            except sqlite3.DatabaseError as exc:
                raise BrokerUnavailableError(
                    f"{self.path} is not a usable SQLite database: {exc}",
                    operation="sqlite.migrate",
                ) from exc
            finally:
                conn.close()
            self._check_version(version, "sqlite.migrate")
            return version

        version = await asyncio.to_thread(read)
        return [m.file for m in MIGRATIONS if m.version > version]

    async def close(self) -> None:
        """Close the connection and stop the database thread (idempotent)."""
        self._stop_watching()
        self.listener.close()
        self.sender.close()
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(executor, self._close_conn)
        finally:
            executor.shutdown(wait=False)

    async def ping(self) -> None:
        """One cheap query on the database thread."""
        await self.call("sqlite.ping", lambda conn: conn.execute("SELECT 1").fetchone())

    # ------------------------------------------------------------------ shared writes

    def notify(self, queues: Iterable[str]) -> None:
        """Wake idle waiters on this file, of this process and of others (after a commit)."""
        wanted = frozenset(queues)
        mailbox.notify(self.key, wanted)
        self.sender.send(wanted)

    # ------------------------------------------------------------------ wake-ups of other processes

    def watch(self, loop: asyncio.AbstractEventLoop) -> bool:
        """While a ``wait_for_work`` runs on ``loop``: datagrams of other processes post to
        the mailbox. ``False`` when the channel is unavailable (the poll serves alone).
        Datagrams that came before are dropped (up to ``MAX_DRAIN``; any left over wake it
        for nothing, which is allowed): the caller's ``data_version`` look, made after this,
        answers for their commits."""
        if self._watchers:
            if self._watch_loop is not loop:
                return False  # another event loop watches: this one polls
            self._watchers += 1
            return True
        sock = self.listener.open()
        if sock is None:
            return False
        self.listener.drain()
        try:
            loop.add_reader(sock.fileno(), self._on_datagram)
        except NotImplementedError:  # an event loop without readers: poll
            return False
        self._watchers, self._watch_loop, self._watch_fd = 1, loop, sock.fileno()
        return True

    def unwatch(self) -> None:
        if self._watchers == 0:
            return
        self._watchers -= 1
        if self._watchers == 0:
            self._stop_watching()

    def _stop_watching(self) -> None:
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        if self._watch_loop is not None:
            self._watch_loop.remove_reader(self._watch_fd)
            self._watch_loop = None
        self._watchers = 0

    def _on_datagram(self) -> None:
        queues = self.listener.drain()
        if queues:
            self.mailbox.post(frozenset(queues))
        loop = self._watch_loop
        if self.listener.flooded and loop is not None:
            # More datagrams than a waiter needs: a flood, or a sender gone wrong. Stop
            # reading until the listener's budget comes back (the poll serves meanwhile):
            # the loop reads at most MAX_DRAIN per poll interval, the kernel drops the rest.
            loop.remove_reader(self._watch_fd)
            self._paused = loop.call_later(self.listener.resume_in(), self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self._watch_loop is not None:
            self._watch_loop.add_reader(self._watch_fd, self._on_datagram)

    def ended(self, tasks: Iterable[tuple[str, str]]) -> None:
        """These ``(queue, id)`` ended: wake this process's watches of them (after a commit)."""
        mailbox.ended(self.key, tasks)

    def insert(
        self,
        conn: Exec,
        p: EnqueueParams,
        now: float,
        *,
        record_queue: bool = True,
        for_group: bool = False,
        waits_for: int = 0,
    ) -> TaskInfo:
        """Create one task or raise its conflict; a refusal writes nothing of its own.
        ``record_queue=False``: the caller records the queue (once per batch).
        ``for_group``: a group's follow-up, waiting for its group (one more thing to wait
        for, which the group's own count releases). ``waits_for``: dependencies the caller
        lists it with itself (a graph's earlier tasks)."""
        until = p.scheduled_until(now)
        holding = self._unfinished(conn, p.after) if p.after else []
        waits = len(holding) + for_group + waits_for
        values = {
            "id": p.id,
            "queue": p.queue,
            "type": p.type,
            "payload": p.payload,
            "state": "waiting" if waits else "pending" if until is None else "scheduled",
            "waiting_for": waits,
            "max_retry": p.max_retry,
            "timeout": p.timeout,
            "deadline": p.deadline,
            "next_process_at": now if until is None else until,
            "relative_due": 1 if until is not None and p.process_in else 0,
            "now": now,
            "retention": p.retention,
            "headers": json.dumps(p.headers, separators=(",", ":"), sort_keys=True),
            "unique_key": p.unique_key,
            "unique_until": None
            if p.unique_key is None or p.unique_ttl is None
            else now + p.unique_ttl,
            "priority": p.priority,
            "limits": limits_to_json(p.limits),
            "fair_template": None,
            "fair_key": None,
        }
        fair = fair_spec(p.limits)
        if fair is not None:
            values["fair_template"], values["fair_key"] = fair.fair, fair.key
        # The insert first: a free id and key are the common case, and cost one statement
        # instead of four.
        row = conn.execute(STATEMENTS["insert_task"], values).fetchone()
        if row is None:
            self._make_room(conn, p, now)
            row = conn.execute(STATEMENTS["insert_task"], values).fetchone()
            # The write lock is held: what _make_room found free is still free.
            assert row is not None, "a holder survived the checks in the same transaction"
        if record_queue:
            self.record_queues(conn, (p.queue,), now)
        for queue, task_id in holding:  # after the insert: a refused task holds nothing
            conn.execute(
                STATEMENTS["hold_dependent"],
                {"queue": queue, "id": task_id, "w_queue": p.queue, "w_id": p.id},
            )
        return row_to_info(row)

    @staticmethod
    def _unfinished(conn: Exec, after: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """The dependencies of ``after`` that exist and have not finished (the write lock is
        held: they stay so until this transaction ends)."""
        keys = json.dumps([list(k) for k in after])
        found = {
            (r["queue"], r["id"])
            for r in conn.execute(STATEMENTS["dependency_states"], {"keys": keys})
            if dependencies.unfinished(r["state"])
        }
        return [k for k in after if k in found]

    def give_back(self, conn: Exec, queue: str, limits: str) -> bool:
        """The keys of ``limits`` (a task's stored limits) get their units back (W13, W24);
        whether tasks are held on one of them (the queue's workers should look again)."""
        rows = conn.execute(STATEMENTS["release_limits"], {"queue": queue, "limits": limits})
        return any(row["waiting"] for row in rows.fetchall())

    def kept_limits(self, conn: Exec, queue: str, task_id: str | None, state: str) -> list[str]:
        """W25, read before the inspector archives or deletes the task ``task_id`` (``None``:
        every task of ``state``; the write lock is held): the stored limits of those that
        kept their sequences' keys."""
        values = {"queue": queue, "id": task_id, "state": state}
        return [row[0] for row in conn.execute(STATEMENTS["kept_limits"], values).fetchall()]

    def give_back_kept(self, conn: Exec, queue: str, lists: Iterable[str]) -> bool:
        """W25: the tasks of ``lists`` (:meth:`kept_limits`) left without finishing an
        attempt: their sequences' slots come back; whether tasks are held on one of them."""
        wake = False
        for raw in lists:
            kept = limits_to_json(limiter.kept_back(limits_from_json(raw)))
            if kept is not None and self.give_back(conn, queue, kept):
                wake = True
        return wake

    def release_dependents(self, conn: Exec, lists: Iterable[str | None], now: float) -> set[str]:
        """Tasks whose ``dependents`` are given finished (or were deleted unfinished): count
        each dependent down, release those at zero; the queues that got pending work."""
        woken: set[str] = set()
        for (queue, task_id), n in dependencies.countdown(lists).items():
            key = {"queue": queue, "id": task_id}
            row = conn.execute(STATEMENTS["waiting_task"], key).fetchone()
            if row is None:
                continue  # cancelled, deleted or archived meanwhile
            left = dependencies.left_after(row["waiting_for"], n)
            state = dependencies.released(row["next_process_at"], now) if left == 0 else None
            conn.execute(
                STATEMENTS["count_down"],
                {**key, "waiting_for": left, "state": (state or TaskState.WAITING).value},
            )
            if state is TaskState.PENDING:
                woken.add(queue)
        return woken

    def _make_room(self, conn: Exec, p: EnqueueParams, now: float) -> None:
        """After a refused insert: free what only looks taken (a completed task past its
        retention, a stale unique key) or raise the conflict of a live holder."""
        key = {"queue": p.queue, "id": p.id, "now": now}
        conn.execute(STATEMENTS["drop_expired_completed"], key)
        existing = self.get_row(conn, p.queue, p.id, now)
        if existing is not None:
            raise TaskIDConflictError(
                f"task {p.id!r} already exists in queue {p.queue!r} ({existing['state']})",
                existing=row_to_info(existing),
            )
        if p.unique_key is not None:
            unique = {"unique_key": p.unique_key, "now": now}
            conn.execute(STATEMENTS["release_stale_unique"], unique)
            holder = conn.execute(STATEMENTS["find_unique"], unique).fetchone()
            if holder is not None:
                raise DuplicateTaskError(
                    f"an identical task {holder['id']!r} is already queued",
                    existing_id=holder["id"],
                )

    def record_queues(self, conn: Exec, queues: Iterable[str], now: float) -> None:
        """Record the queues tasks were written to (the inspector lists them)."""
        for queue in queues:
            conn.execute(STATEMENTS["ensure_queue"], {"queue": queue, "now": now})

    def insert_follow_ups(
        self, conn: Exec, follow_ups: Iterable[EnqueueParams], now: float
    ) -> set[str]:
        """Create continuation tasks inside the caller's transaction; a follow-up whose id
        (or unique key) is taken is skipped. Returns the queues that got pending work."""
        queues: set[str] = set()
        for p in follow_ups:
            try:
                info = self.insert(conn, p, now)
            except (TaskIDConflictError, DuplicateTaskError):
                continue  # created by an earlier outcome of the same task
            if info.state is TaskState.PENDING:
                queues.add(p.queue)
        return queues

    # ------------------------------------------------------------------ groups

    def insert_graph(
        self,
        conn: Exec,
        items: Sequence[EnqueueParams],
        now: float,
        workflow: WorkflowParams | None = None,
    ) -> list[TaskInfo]:
        """Create every task of a graph, each waiting for its earlier items, and the
        workflow's record; the first refusal raises (the caller's transaction rolls
        everything back). Each dependency's list of dependents is written once, not
        appended to once per dependent."""
        edges = dependencies.graph_edges(items)
        check_distinct(items, now)
        infos = [
            self.insert(conn, replace(p, after=()), now, record_queue=False, waits_for=len(e))
            for p, e in zip(items, edges, strict=True)
        ]
        dependents: dict[int, list[list[str]]] = {}
        for i, e in enumerate(edges):
            for j in e:
                dependents.setdefault(j, []).append([items[i].queue, items[i].id])
        conn.executemany(
            STATEMENTS["set_dependents"],
            [
                {"queue": items[j].queue, "id": items[j].id, "dependents": json.dumps(listed)}
                for j, listed in dependents.items()
            ],
        )
        self.record_queues(conn, {p.queue for p in items}, now)
        if workflow is not None:
            row = {"id": workflow.id, "name": workflow.name, "retention": workflow.retention}
            # To the microsecond, as a listing's cursor spells it.
            conn.execute(STATEMENTS["insert_workflow"], {**row, "now": round(now, 6)})
            conn.execute(STATEMENTS["forget_workflow_nodes"], {"id": workflow.id})
            conn.executemany(
                STATEMENTS["insert_workflow_node"], sqlfiles.workflow_node_rows(workflow)
            )
        return infos

    def insert_group(self, conn: Exec, p: GroupParams, now: float) -> list[TaskInfo]:
        """Create a group's record, its members and its follow-up (waiting for the group);
        the first refusal raises (the caller's transaction rolls everything back)."""
        infos = [self.insert(conn, member, now) for member in p.members]
        then = waiting_follow_up(p)
        if then is not None:
            self.insert(conn, then, now, for_group=True)
        conn.execute(STATEMENTS["insert_group"], sqlfiles.group_row(p, now))
        conn.executemany(
            STATEMENTS["insert_group_member"],
            [
                {
                    "group_queue": p.queue,
                    "group_id": p.id,
                    "position": i,
                    "queue": m.queue,
                    "task_id": m.id,
                    "type": m.type,
                    "entry": entry,
                }
                for i, (m, entry) in enumerate(zip(p.members, p.unfinished, strict=True))
            ],
        )
        return infos

    def finish_member(
        self, conn: Exec, queue: str, task_id: str, outcome: MemberOutcome, now: float
    ) -> set[str]:
        """Record a member's outcome and count it (see :meth:`count_finished`)."""
        rows = conn.execute(
            STATEMENTS["finish_member"],
            {
                "group_queue": outcome.group_queue,
                "group_id": outcome.group,
                "queue": queue,
                "id": task_id,
                "state": outcome.state,
                "entry": outcome.entry,
            },
        ).fetchall()
        return self.count_finished(conn, rows, now)

    def forget(
        self, conn: Exec, queue: str, task_id: str | None, state: str, now: float
    ) -> set[str]:
        """Before the inspector deletes a task (``task_id``) or every task of ``state``: the
        unfinished group members among them finish as deleted."""
        if task_id is not None:
            rows = conn.execute(
                STATEMENTS["forget_member"], {"queue": queue, "id": task_id}
            ).fetchall()
        else:
            rows = conn.execute(
                STATEMENTS["forget_members_in_state"], {"queue": queue, "state": state}
            ).fetchall()
        return self.count_finished(conn, rows, now)

    def count_finished(self, conn: Exec, rows: list[sqlite3.Row], now: float) -> set[str]:
        """Count newly finished members (one row per member: its group) and release the
        follow-up of each group whose last member this was (create it, for a group
        recorded before follow-ups waited); the queues that got work."""
        woken: set[str] = set()
        for (group_queue, group_id), n in Counter((r[0], r[1]) for r in rows).items():
            key = {"group_queue": group_queue, "group_id": group_id}
            g = conn.execute(STATEMENTS["count_finished"], {**key, "n": n, "now": now}).fetchone()
            if g is None or g["finished"] < g["total"] or g["then_task"] is None:
                continue
            entries = [bytes(r[0]) for r in conn.execute(STATEMENTS["group_entries"], key)]
            payload = fan_in_payload(bytes(g["then_head"]), entries, bytes(g["then_tail"]))
            then = follow_up_from(g["then_task"], payload)
            if not g["then_waiting"]:  # a group created before its follow-up waited
                woken |= self.insert_follow_ups(conn, [then], now)
                continue
            released = conn.execute(
                STATEMENTS["release_follow_up"],
                {"queue": then.queue, "id": then.id, "payload": payload, "now": now},
            ).fetchone()
            if released is not None and released["state"] == TaskState.PENDING.value:
                woken.add(then.queue)
        return woken

    def bump(self, conn: Conn, queue: str, now: float, *, failed: bool, count: int = 1) -> None:
        """Add ``count`` processed (and as many failed, if ``failed``) to the counters of
        today and of this minute."""
        counts = {"queue": queue, "processed": count, "failed": count * failed}
        conn.execute(STATEMENTS["bump_stats"], {**counts, "day": utc_day(now).isoformat()})
        conn.execute(STATEMENTS["bump_minute_stats"], {**counts, "minute": minute_of(now)})

    def get_row(self, conn: Exec, queue: str, task_id: str, now: float) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            STATEMENTS["get_task"], {"queue": queue, "id": task_id, "now": now}
        ).fetchone()
        return row


def schema_version(conn: Exec) -> int:
    """The applied schema version; 0 for a file without durq tables."""
    if not conn.execute(STATEMENTS["has_migrations_table"]).fetchone()[0]:
        return 0
    return int(conn.execute(STATEMENTS["schema_version"]).fetchone()[0])


def applied_versions(conn: Exec) -> set[int]:
    """The versions of the migrations applied; empty for a file without durq tables."""
    if not conn.execute(STATEMENTS["has_migrations_table"]).fetchone()[0]:
        return set()
    return {int(row[0]) for row in conn.execute(STATEMENTS["applied_versions"])}


def split_statements(script: str) -> list[str]:
    """Split a script into statements, using SQLite's own notion of a complete statement."""
    statements: list[str] = []
    current: list[str] = []
    for line in script.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("--")):
            continue
        current.append(line)
        text = "\n".join(current)
        if sqlite3.complete_statement(text):
            statements.append(text.strip())
            current = []
    if current and "\n".join(current).strip():
        raise ValueError("migration ends with an incomplete statement")
    return statements
