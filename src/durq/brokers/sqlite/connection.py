"""Plumbing of the SQLite broker: one database thread per broker, transactions, schema, errors.

Python's ``sqlite3`` blocks, so every call runs in a single-thread executor that owns the
connection: calls of one broker are serialised, and the event loop never waits on the disk.
Write transactions start with ``BEGIN IMMEDIATE``: the write lock is taken up front, so two
processes never interleave a read-then-write (claim) and nobody hits a mid-transaction BUSY.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TypeVar

from durq.brokers.base import EnqueueParams
from durq.brokers.sqlite import wakeup
from durq.brokers.sqlite.queries import MIGRATIONS, SCHEMA_VERSION, Q
from durq.clock import SYSTEM_CLOCK, Clock, to_datetime
from durq.errors import (
    BrokerError,
    BrokerUnavailableError,
    DuplicateTaskError,
    DurqError,
    SchemaError,
    TaskIDConflictError,
)
from durq.states import TaskState
from durq.task import TaskInfo

T = TypeVar("T")
Conn = sqlite3.Connection
#: What statements run on: our connection, or a cursor on a caller's connection (E8).
Exec = sqlite3.Connection | sqlite3.Cursor

#: How long a writer waits for another connection's write lock before giving up.
DEFAULT_BUSY_TIMEOUT = 5.0
#: How often an idle ``wait_for_work`` looks for commits of other processes.
DEFAULT_POLL_INTERVAL = 0.025


def utc_day(ts: float) -> str:
    """The UTC day of an epoch time, as the stats table keys it."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d")


def row_to_info(row: sqlite3.Row) -> TaskInfo:
    """A ``durq_tasks`` row as the :class:`TaskInfo` users see."""
    result = row["result"]
    return TaskInfo(
        id=row["id"],
        queue=row["queue"],
        type=row["type"],
        raw_payload=bytes(row["payload"]),
        state=TaskState(row["state"]),
        max_retry=row["max_retry"],
        retried=row["retried"],
        last_error=row["last_error"],
        timeout=None if row["timeout"] is None else float(row["timeout"]),
        deadline=to_datetime(row["deadline"]),
        next_process_at=to_datetime(row["next_process_at"]),
        enqueued_at=to_datetime(row["enqueued_at"]),
        completed_at=to_datetime(row["completed_at"]),
        raw_result=None if result is None else bytes(result),
        retention=float(row["retention"]),
        lost=row["lost"],
        headers=json.loads(row["headers"] or "{}"),
        started_at=to_datetime(row["started_at"]),
        lease_expires_at=to_datetime(row["lease_expires_at"]),
        worker_id=row["worker_id"],
        cancel_requested=bool(row["cancel_requested"]),
    )


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


def join_write_lock(cursor: sqlite3.Cursor) -> None:
    """In a caller's open transaction, ask for the write lock before anything reads: SQLite
    waits (busy timeout) for a lock asked first, but refuses at once a transaction that has
    read and then wants to write. A file without durq tables is left to the schema check."""
    if not cursor.connection.in_transaction:
        return  # Python's implicit BEGIN comes with the first write, which waits anyway
    try:
        cursor.execute(Q["take_write_lock"])
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


class SQLiteBase:
    """The database thread, the connection and the schema; the broker and admin build on it."""

    name = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self.path = os.path.abspath(path)
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._poll_interval = poll_interval
        # Key of the in-process wake-up registry: every broker on this file shares it.
        self._key = os.path.realpath(self.path)
        self._mailbox = wakeup.register(self._key)
        # data_version when this broker last looked for work (claim or wake-up): a change
        # since then means another connection committed, maybe an enqueue.
        self._seen_version: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        # The sync face may call from several threads: one executor, hence one connection.
        self._executor_lock = threading.Lock()
        # Touched only from the database thread.
        self._conn: Conn | None = None
        self._applied: list[str] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path}>"

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with."""
        return self._clock

    # ------------------------------------------------------------------ calls

    async def _call(self, operation: str, fn: Callable[[Conn], T]) -> T:
        """Run ``fn(connection)`` on the database thread, opening the connection if needed."""
        executor = self._executor
        if executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="durq-sqlite")
                executor = self._executor
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self._job, operation, fn)

    async def _write(self, operation: str, fn: Callable[[Conn], T]) -> T:
        """``fn`` inside one ``BEGIN IMMEDIATE`` transaction."""
        return await self._call(operation, lambda conn: transaction(conn, fn))

    async def _read(self, operation: str, fn: Callable[[Conn], T]) -> T:
        """``fn`` against one consistent snapshot."""
        return await self._call(operation, lambda conn: snapshot(conn, fn))

    def _job(self, operation: str, fn: Callable[[Conn], T]) -> T:
        try:
            conn = self._conn if self._conn is not None else self._open(operation)
            return fn(conn)
        except DurqError:
            raise
        except sqlite3.Error as exc:
            raise self._wrap(exc, operation) from exc

    def _wrap(self, exc: sqlite3.Error, operation: str, *, caller: bool = False) -> DurqError:
        """The typed error of a sqlite3 error; ``caller``: it happened in the caller's
        transaction (E8), whose connection has its own busy timeout."""
        text = str(exc) or type(exc).__name__
        if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError):
            return BrokerError(f"SQLite refused the operation: {text}", operation=operation)
        if caller and ("locked" in text or "busy" in text):
            text = (
                f"{text} (the caller's transaction waited for the write lock for its "
                "connection's timeout, or had read before writing: begin it with BEGIN "
                "IMMEDIATE)"
            )
        elif "locked" in text or "busy" in text:
            text = f"{text} (another connection held the write lock for {self._busy_timeout:g} s)"
        return BrokerUnavailableError(f"SQLite database {self.path}: {text}", operation=operation)

    # ------------------------------------------------------------------ connection and schema

    def _open(self, operation: str) -> Conn:
        """Open the connection, set its pragmas and bring the schema up to date (embedded:
        nothing to install, so connecting migrates; a newer schema is refused)."""
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,  # autocommit: transactions are explicit BEGIN/COMMIT
                check_same_thread=False,  # the executor thread owns it; close() may differ
            )
        except sqlite3.Error as exc:
            raise BrokerUnavailableError(
                f"cannot open SQLite database {self.path}: {exc}", operation=operation
            ) from exc
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
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
            raise self._wrap(exc, operation) from exc
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise BrokerUnavailableError(
                f"{self.path} is not a usable SQLite database: {exc}", operation=operation
            ) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _migrate(self, conn: Conn, operation: str) -> list[str]:
        """Apply the missing migrations in one immediate transaction (safe across processes)."""
        current = schema_version(conn)
        self._check_version(current, operation)
        if current == SCHEMA_VERSION:
            return []

        def apply(c: Conn) -> list[str]:
            c.execute(Q["migrations_table"])
            version = schema_version(c)  # another process may have migrated meanwhile
            self._check_version(version, operation)
            done: list[str] = []
            for migration in MIGRATIONS:
                if migration.version <= version:
                    continue
                for statement in migration.statements():
                    c.execute(statement)
                c.execute(
                    Q["record_migration"],
                    {
                        "version": migration.version,
                        "name": migration.name,
                        "now": self._clock.now(),
                    },
                )
                done.append(migration.name)
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
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    async def connect(self) -> None:
        """Open the connection and migrate the schema if needed (idempotent).

        Raises BrokerUnavailableError (unreachable path, not a database) or SchemaError
        (a schema newer than this code)."""
        await self._call("sqlite.connect", lambda conn: None)

    async def migrate(self) -> list[str]:
        """Apply missing migrations; returns the names applied by this call."""

        def run(conn: Conn) -> list[str]:
            applied = self._applied + self._migrate(conn, "sqlite.migrate")
            self._applied = []
            return applied

        return await self._call("sqlite.migrate", run)

    async def close(self) -> None:
        """Close the connection and stop the database thread (idempotent)."""
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
        await self._call("sqlite.ping", lambda conn: conn.execute("SELECT 1").fetchone())

    # ------------------------------------------------------------------ helpers for subclasses

    def _notify(self, queues: Iterable[str]) -> None:
        """Wake idle waiters of this process on this file (called after a commit)."""
        wakeup.notify(self._key, queues)

    def _insert(self, conn: Exec, p: EnqueueParams, now: float) -> TaskInfo:
        """Create one task or raise its conflict; a refusal writes nothing of its own."""
        key = {"queue": p.queue, "id": p.id, "now": now}
        conn.execute(Q["drop_expired_completed"], key)
        existing = self._get_row(conn, p.queue, p.id, now)
        if existing is not None:
            raise TaskIDConflictError(
                f"task {p.id!r} already exists in queue {p.queue!r} ({existing['state']})",
                existing=row_to_info(existing),
            )
        if p.unique_key is not None:
            unique = {"unique_key": p.unique_key, "now": now}
            conn.execute(Q["release_stale_unique"], unique)
            holder = conn.execute(Q["find_unique"], unique).fetchone()
            if holder is not None:
                raise DuplicateTaskError(
                    f"an identical task {holder['id']!r} is already queued",
                    existing_id=holder["id"],
                )
        scheduled = p.process_at is not None and p.process_at > now
        row = conn.execute(
            Q["insert_task"],
            {
                "id": p.id,
                "queue": p.queue,
                "type": p.type,
                "payload": p.payload,
                "state": "scheduled" if scheduled else "pending",
                "max_retry": p.max_retry,
                "timeout": p.timeout,
                "deadline": p.deadline,
                "next_process_at": p.process_at if scheduled else now,
                "now": now,
                "retention": p.retention,
                "headers": json.dumps(p.headers, separators=(",", ":"), sort_keys=True),
                "unique_key": p.unique_key,
                "unique_until": None
                if p.unique_key is None or p.unique_ttl is None
                else now + p.unique_ttl,
            },
        ).fetchone()
        conn.execute(Q["ensure_queue"], {"queue": p.queue, "now": now})
        return row_to_info(row)

    def _insert_follow_ups(
        self, conn: Exec, follow_ups: Iterable[EnqueueParams], now: float
    ) -> set[str]:
        """Create continuation tasks inside the caller's transaction; a follow-up whose id
        (or unique key) is taken is skipped. Returns the queues that got pending work."""
        queues: set[str] = set()
        for p in follow_ups:
            try:
                info = self._insert(conn, p, now)
            except (TaskIDConflictError, DuplicateTaskError):
                continue  # created by an earlier outcome of the same task
            if info.state is TaskState.PENDING:
                queues.add(p.queue)
        return queues

    def _bump(self, conn: Conn, queue: str, now: float, *, failed: bool, count: int = 1) -> None:
        """Add ``count`` processed (and as many failed, if ``failed``) to today's counters."""
        conn.execute(
            Q["bump_stats"],
            {"queue": queue, "day": utc_day(now), "processed": count, "failed": count * failed},
        )

    def _get_row(self, conn: Exec, queue: str, task_id: str, now: float) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            Q["get_task"], {"queue": queue, "id": task_id, "now": now}
        ).fetchone()
        return row


def schema_version(conn: Exec) -> int:
    """The applied schema version; 0 for a file without durq tables."""
    if not conn.execute(Q["has_migrations_table"]).fetchone()[0]:
        return 0
    return int(conn.execute(Q["schema_version"]).fetchone()[0])
