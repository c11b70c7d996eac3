"""The embedded SQLite broker: the default, nothing to install (``sqlite:///durq.sqlite3``).

Several worker processes on one machine may share the file: every write is one
``BEGIN IMMEDIATE`` transaction, so a claim's select-and-lease is atomic across processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

from durq import ranges
from durq.brokers import limiter, mailbox
from durq.brokers.batcher import enqueue_coalescer
from durq.brokers.contract import (
    CAP_COMPLETE_AND_CLAIM,
    CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
    CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS,
    CAP_CROSS_PROCESS_NOTIFY,
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    CAP_CROSS_QUEUE_GROUPS,
    CAP_DEPENDENCIES,
    CAP_MULTI_PROCESS,
    CAP_SYNC_CONNECTION_ENQUEUE,
    CAP_TRANSACTIONAL_ENQUEUE,
    EndWatch,
)
from durq.brokers.mailbox import Waiter
from durq.brokers.params import (
    CLAIM_FORWARD,
    ArchivedRetention,
    ArchiveParams,
    Claimed,
    ClaimParams,
    CompleteParams,
    EnqueueOutcome,
    EnqueueParams,
    GroupParams,
    Lease,
    LeaseMove,
    LeaseRef,
    LeaseReport,
    ProgressParams,
    RetryParams,
    SignalParams,
    StepsParams,
    TwinReplace,
    UniqueRelease,
    WorkflowParams,
    ended_by,
)
from durq.brokers.sqlfiles import twin_params
from durq.brokers.sqlite import files
from durq.brokers.sqlite.admin import SQLiteAdmin
from durq.brokers.sqlite.storage import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    SCHEMA_VERSION,
    STATEMENTS,
    Conn,
    Exec,
    SQLiteStorage,
    join_write_lock,
    schema_version,
)
from durq.brokers.sqlrows import row_to_info
from durq.brokers.views import FORGET_WORKERS_AFTER, MINUTE_COUNTS_KEEP, WorkerInfo
from durq.clock import SYSTEM_CLOCK, Clock
from durq.errors import (
    ConfigurationError,
    DuplicateTaskError,
    SchemaError,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.progress import append_lines
from durq.states import TaskState
from durq.task import LimitSpec, TaskInfo, limits_from_json, limits_to_json


class SQLiteBroker:
    """Broker and Admin on one SQLite file (WAL mode, one database thread per instance): the
    hot path here, the inspector in :class:`SQLiteAdmin`, both on one :class:`SQLiteStorage`."""

    name = "sqlite"
    #: Other processes wake waiters by datagram; ``PRAGMA data_version`` polling backs it. E8 joins a caller's
    #: ``sqlite3.Connection`` on the same file (see :meth:`enqueue_sync_in`).
    capabilities: frozenset[str] = frozenset(
        {
            CAP_MULTI_PROCESS,
            CAP_CROSS_PROCESS_NOTIFY,
            CAP_COMPLETE_AND_CLAIM,
            CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
            CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS,
            CAP_CROSS_QUEUE_FOLLOW_UPS,
            CAP_CROSS_QUEUE_GROUPS,
            CAP_DEPENDENCIES,
            CAP_TRANSACTIONAL_ENQUEUE,
            CAP_SYNC_CONNECTION_ENQUEUE,
        }
    )

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> Self:
        """``sqlite:///relative/path.db`` (from the working directory) or
        ``sqlite:////abs/path.db``. Options: ``?busy_timeout=5`` (seconds to wait for the
        write lock, at most a day), ``?poll_interval=0.025`` (cross-process wake-up polling,
        seconds, above 0 and at most a day), ``?file_mode=0600`` (octal mode of the database
        files it creates): ConfigurationError outside those ranges."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "sqlite":
            raise ConfigurationError(f"not a sqlite URL: {url!r}")
        if parts.netloc:
            raise ConfigurationError(
                f"sqlite URLs have no host: use sqlite:///relative.db or sqlite:////abs.db, "
                f"not {url!r}"
            )
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise ConfigurationError(f"sqlite URL without a file path: {url!r}")
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - {"busy_timeout", "poll_interval", "file_mode"}
        if unknown:
            raise ConfigurationError(f"unknown sqlite URL option(s): {', '.join(sorted(unknown))}")
        busy = options.get("busy_timeout", DEFAULT_BUSY_TIMEOUT)
        poll = options.get("poll_interval", DEFAULT_POLL_INTERVAL)
        mode = files.parse_file_mode(options.get("file_mode", f"{files.DEFAULT_FILE_MODE:o}"))
        return cls(
            path,
            clock=clock,
            busy_timeout=ranges.seconds("busy_timeout", busy),
            poll_interval=ranges.seconds("poll_interval", poll, positive=True),
            file_mode=mode,
        )

    def __init__(
        self,
        path: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        file_mode: int = files.DEFAULT_FILE_MODE,
    ) -> None:
        """``file_mode``: the mode of the database files created (``0o600``: owner only;
        an existing file keeps its own, see ``files.py``)."""
        self._storage = SQLiteStorage(
            path,
            clock=clock,
            busy_timeout=busy_timeout,
            poll_interval=poll_interval,
            file_mode=file_mode,
        )
        self.admin = SQLiteAdmin(self._storage)
        self._batcher = enqueue_coalescer(self._enqueue_one, self.enqueue_many)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path}>"

    @property
    def path(self) -> str:
        """The database file (absolute)."""
        return self._storage.path

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with."""
        return self._storage.clock

    async def connect(self) -> None:
        """Open the connection and migrate the schema if needed (idempotent).

        Raises BrokerUnavailableError (unreachable path, not a database) or SchemaError
        (a schema newer than this code)."""
        await self._storage.connect()

    async def migrate(self) -> list[str]:
        """Apply missing migrations; returns the names applied by this call."""
        return await self._storage.migrate()

    async def pending_migrations(self) -> list[str]:
        """The migrations :meth:`migrate` would apply, read without writing."""
        return await self._storage.pending_migrations()

    async def close(self) -> None:
        """Close the connection and stop the database thread (idempotent)."""
        await self._storage.close()

    async def ping(self) -> None:
        """One cheap query on the database thread."""
        await self._storage.ping()

    # ------------------------------------------------------------------ enqueue

    async def enqueue(self, params: EnqueueParams, *, connection: Any = None) -> TaskInfo:
        """Create one task, atomically checking task id (E3) and uniqueness (E4).

        ``connection``: the caller's ``sqlite3.Connection`` on this broker's file; the task
        is written in its open transaction and exists only if the caller commits (E8)."""
        if connection is not None:
            # Not self.connect(): migrating needs the write lock the caller may hold.
            return self.enqueue_sync_in(params, connection)
        # Calls made while another is in flight go together in one transaction.
        return await self._batcher.send(params)

    async def _enqueue_one(self, params: EnqueueParams) -> TaskInfo:
        def run(conn: Conn) -> TaskInfo:
            info = self._storage.transaction(
                conn, lambda c, now: self._storage.insert(c, params, now)
            )
            self._storage.notify([params.queue])
            return info

        return await self._storage.call("sqlite.enqueue", run)

    async def enqueue_many(
        self, items: Sequence[EnqueueParams], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """All items in one transaction; a refused item does not undo the others (E9).

        ``connection``: as in :meth:`enqueue`, all items join the caller's transaction."""
        if not items:
            return []
        if connection is not None:
            return self.enqueue_many_sync_in(items, connection)

        def run(conn: Conn) -> list[EnqueueOutcome]:
            outcomes = self._storage.transaction(
                conn, lambda c, now: self._insert_many(c, items, now)
            )
            self._storage.notify({o.params.queue for o in outcomes if o.created})
            return outcomes

        return await self._storage.call("sqlite.enqueue_many", run)

    async def enqueue_group(self, params: GroupParams) -> list[TaskInfo]:
        """The group's record, every member and the waiting follow-up in one transaction,
        or nothing."""
        return await self._create_all(
            "sqlite.enqueue_group", lambda c, now: self._storage.insert_group(c, params, now)
        )

    async def enqueue_graph(
        self, items: Sequence[EnqueueParams], workflow: WorkflowParams | None = None
    ) -> list[TaskInfo]:
        """Every task of a graph, waiting for its earlier items, and the workflow's record
        in one transaction, or nothing."""
        return await self._create_all(
            "sqlite.enqueue_graph",
            lambda c, now: self._storage.insert_graph(c, items, now, workflow),
        )

    async def _create_all(
        self, operation: str, write: Callable[[Conn, float], list[TaskInfo]]
    ) -> list[TaskInfo]:
        """``write`` in one transaction (a refusal it raises rolls everything back), then
        wake the queues that got pending tasks."""

        def run(conn: Conn) -> list[TaskInfo]:
            infos = self._storage.transaction(conn, write)
            self._storage.notify({i.queue for i in infos if i.state is TaskState.PENDING})
            return infos

        infos: list[TaskInfo] = await self._storage.call(operation, run)
        return infos

    def _insert_many(
        self, conn: Exec, items: Sequence[EnqueueParams], now: float
    ) -> list[EnqueueOutcome]:
        outcomes: list[EnqueueOutcome] = []
        for p in items:
            try:
                info = self._storage.insert(conn, p, now, record_queue=False)
                outcomes.append(EnqueueOutcome(p, info=info))
            except (TaskIDConflictError, DuplicateTaskError) as exc:
                outcomes.append(EnqueueOutcome(p, error=exc))
        self._storage.record_queues(conn, {o.params.queue for o in outcomes if o.created}, now)
        return outcomes

    # ------------------------------------------------------------------ E8: the caller's connection

    def enqueue_sync_in(self, params: EnqueueParams, connection: sqlite3.Connection) -> TaskInfo:
        """Create one task inside the caller's open sqlite3 transaction (E8); no commit.

        Runs on the calling thread (a sqlite3 connection belongs to its thread). The durq
        tables must exist (open the broker once, or ``durq migrate``): migrating here would
        need the write lock the caller's transaction may hold, so a missing schema raises
        SchemaError. Workers notice the task once the caller commits, through
        ``PRAGMA data_version`` polling (within the broker's ``poll_interval``): sqlite3 has
        no commit hook to wake them at once."""
        (outcome,) = self.enqueue_many_sync_in([params], connection)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.info is not None
        return outcome.info

    def enqueue_many_sync_in(
        self, items: Sequence[EnqueueParams], connection: sqlite3.Connection
    ) -> list[EnqueueOutcome]:
        """``enqueue_many`` inside the caller's open sqlite3 transaction (E8); no commit."""
        if not items:
            return []
        cursor = self._caller_cursor(connection)
        try:
            # Under the caller's write lock: catch up with a step of the wall clock first.
            now = self._storage.timeline.check(cursor, STATEMENTS, remember=False)
            return self._insert_many(cursor, items, now)
        except sqlite3.Error as exc:
            raise self._storage.map_error(exc, "sqlite.enqueue", caller=True) from exc
        finally:
            cursor.close()

    def _caller_cursor(self, connection: Any) -> sqlite3.Cursor:
        """A cursor on the caller's connection, after checking it can hold our rows: the
        broker's own file, at our schema version, with a transaction to join."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                "connection must be a sqlite3.Connection on the broker's file, "
                f"not {type(connection).__name__}"
            )
        try:
            cursor = connection.cursor()
            cursor.row_factory = sqlite3.Row
            files = {
                row["name"]: row["file"] for row in cursor.execute(STATEMENTS["database_list"])
            }
            path = files.get("main") or ""
            if not path or os.path.realpath(path) != self._storage.key:
                raise ConfigurationError(
                    f"the connection has {path or 'an in-memory database'!r} open, not the "
                    f"broker's file {self.path!r}: transactional enqueue needs both in one file"
                )
            join_write_lock(cursor)
            if schema_version(cursor) != SCHEMA_VERSION:
                raise SchemaError(
                    f"{self.path} has no durq tables at this version: open the broker once "
                    "(it migrates) or run `durq migrate` before enqueueing in a transaction",
                    operation="sqlite.enqueue",
                )
        except sqlite3.Error as exc:
            raise self._storage.map_error(exc, "sqlite.enqueue", caller=True) from exc
        autocommit = getattr(connection, "autocommit", None) is True  # Python 3.12+
        if not connection.in_transaction and (connection.isolation_level is None or autocommit):
            cursor.close()
            # In autocommit mode each statement would commit alone: nothing to join.
            raise ConfigurationError(
                "the connection is in autocommit mode with no open transaction: "
                "execute BEGIN first (E8 writes inside the caller's transaction)"
            )
        return cursor

    # ------------------------------------------------------------------ claim and leases

    async def claim(self, params: ClaimParams) -> list[Lease]:
        """Lease up to ``limit`` due tasks, filling from the queues in the order given."""
        looked_at = self._storage.clock.now()  # for the read-only look; the claim reads its own
        if params.limit <= 0:
            return []
        queues = list(dict.fromkeys(params.queues))  # keep order, drop repeats
        # Notifications up to here are answered by this claim; later ones stay for the wait.
        self._storage.mailbox.take(queues)

        def run(conn: Conn) -> Claimed:
            version = _data_version(conn)  # before the claim reads: later commits stay news
            leases = Claimed()
            for queue in queues:
                claimable, wake_at = _may_claim(conn, queue, looked_at)
                if claimable:
                    leases = self._storage.transaction(
                        conn, lambda c, now: self._claim_queues(c, queues, params, now)
                    )
                    break
                if wake_at is not None and (leases.wake_at is None or wake_at < leases.wake_at):
                    leases.wake_at = wake_at
            if len(leases) < params.limit:
                self._storage.seen_version = version
            return leases

        leases = await self._storage.call("sqlite.claim", run, inline=_short(params.limit))
        self._claimed(queues, params, leases)
        return leases

    async def complete_and_claim(
        self, items: Sequence[CompleteParams], claim: ClaimParams
    ) -> tuple[list[bool], list[Lease]]:
        """``complete_many`` and ``claim`` in one write transaction: the lock is taken for
        the completions anyway, so the claim skips its read-only look for work."""
        queues = list(dict.fromkeys(claim.queues))
        self._storage.mailbox.take(queues)
        woken: set[str] = set()

        def body(conn: Conn, now: float) -> tuple[list[bool], Claimed]:
            done = self._complete_batch(conn, items, now, woken)
            return done, self._claim_queues(conn, queues, claim, now)

        def run(conn: Conn) -> tuple[list[bool], Claimed]:
            version = _data_version(conn)
            done, leases = self._storage.transaction(conn, body)
            if len(leases) < claim.limit:
                self._storage.seen_version = version
            return done, leases

        short = _short(len(items) + claim.limit)
        done, leases = await self._storage.call("sqlite.complete_and_claim", run, inline=short)
        self._storage.notify(woken)
        self._storage.ended(p.lease.task_key for p, ok in zip(items, done, strict=True) if ok)
        self._claimed(queues, claim, leases)
        return done, leases

    def _claimed(self, queues: list[str], params: ClaimParams, leases: Claimed) -> None:
        if len(leases) >= params.limit:
            self._storage.mailbox.post(frozenset(queues))  # a full claim may have left work behind

    def _claim_queues(
        self, conn: Conn, queues: list[str], params: ClaimParams, now: float
    ) -> Claimed:
        """The claim's writes, inside the caller's transaction."""
        forward = max(params.limit, CLAIM_FORWARD)
        paused = {row[0] for row in conn.execute(STATEMENTS["paused_queues"])}
        leases = Claimed()
        for queue in queues:
            if queue in paused:
                continue
            conn.execute(
                STATEMENTS["promote_queue"], {"queue": queue, "now": now, "bound": forward}
            )
            self._claim_queue(conn, queue, params, now, leases)
            if len(leases) >= params.limit:
                break
        return leases

    def _claim_queue(
        self, conn: Conn, queue: str, params: ClaimParams, now: float, leases: Claimed
    ) -> None:
        """Lease due tasks of one queue into ``leases`` until it holds ``params.limit``.

        Tasks without limits are leased as they come; a limited one only if each of its
        keys has room (W13), else it is held and the next one is looked at (no head-of-line
        blocking). Held tasks leave the claimable index, so the loop ends."""
        counters = _LimitCounters(conn, queue, now)
        counters.let_back()
        while len(leases) < params.limit:
            want = params.limit - len(leases)
            counters.look = want + FAIR_LOOK
            rows = conn.execute(
                STATEMENTS["claim_candidates"], {"queue": queue, "now": now, "limit": want}
            ).fetchall()
            chosen: list[int] = []
            held = 0
            for row, _ in limiter.in_turns(rows, _rowid, _fair_template, counters.turns):
                if len(chosen) >= want:
                    break
                if row["limits"] is None:
                    chosen.append(row["rowid"])
                elif counters.admit(
                    row["rowid"], limits_from_json(row["limits"]), bool(row["kept"])
                ):
                    chosen.append(row["rowid"])
                    if row["fair_turn"] is not None:
                        counters.started(row["fair_template"], row["fair_turn"])
                else:
                    held += 1
            counters.save()
            if chosen:
                claimed = conn.execute(
                    STATEMENTS["claim"],
                    {
                        "rowids": json.dumps(chosen),
                        "now": now,
                        "lease_seconds": params.lease_seconds,
                        "worker_id": params.worker_id,
                        **self._storage.timeline.lease_params(),
                    },
                ).fetchall()
                # RETURNING gives no order guarantee: restore the order they were chosen in.
                place = {rowid: i for i, rowid in enumerate(chosen)}
                claimed.sort(key=lambda r: place[r["seq"]])
                leases.extend(Lease(row_to_info(r), r["lease_token"]) for r in claimed)
            if not held or len(rows) < want:
                break  # no task held back: nothing more is claimable now
        wake_at = counters.wake_at()
        if wake_at is not None and (leases.wake_at is None or wake_at < leases.wake_at):
            leases.wake_at = wake_at

    async def extend_leases(self, leases: Sequence[LeaseRef], lease_seconds: float) -> LeaseReport:
        """Push every held lease's expiry in one transaction; report lost ones and cancels."""
        if not leases:
            return LeaseReport()

        def body(conn: Conn, now: float) -> LeaseReport:
            lost: set[str] = set()
            cancel: set[str] = set()
            clock = {
                "now": now,
                "lease_seconds": lease_seconds,
                **self._storage.timeline.lease_params(),
            }
            for ref in leases:
                row = conn.execute(
                    STATEMENTS["extend_lease"],
                    {"queue": ref.queue, "id": ref.id, "token": ref.token, **clock},
                ).fetchone()
                if row is None:
                    lost.add(ref.id)
                elif row["cancel_requested"]:
                    cancel.add(ref.id)
            return LeaseReport(lost=frozenset(lost), cancel=frozenset(cancel))

        return await self._storage.write("sqlite.extend_leases", body, inline=_short(len(leases)))

    def _complete(
        self, conn: Conn, p: CompleteParams, now: float, woken: set[str], *, bump: bool = True
    ) -> bool:
        ref = {"queue": p.lease.queue, "id": p.lease.id, "token": p.lease.token}
        if p.retention > 0:
            cursor = conn.execute(
                STATEMENTS["complete_keep"],
                {**ref, "now": now, "result": p.result, "retention": p.retention},
            )
        else:
            cursor = conn.execute(STATEMENTS["complete_delete"], ref)
        if not self._ended(conn, p.lease.queue, cursor, woken, now):
            return False
        if bump:
            self._storage.bump(conn, p.lease.queue, now, failed=False)
        if p.follow_ups:
            woken.update(self._storage.insert_follow_ups(conn, p.follow_ups, now))
        if p.group is not None:
            woken.update(self._storage.finish_member(conn, p.lease.queue, p.lease.id, p.group, now))
        return True

    async def complete(self, params: CompleteParams) -> bool:
        """Completed (kept ``retention`` s with its result) or deleted; fenced by the token.
        Its follow-ups are created in the same transaction."""
        done = await self._storage.write_waking(
            "sqlite.complete",
            lambda c, now, woken: self._complete(c, params, now, woken),
            inline=True,
        )
        if done:
            self._storage.ended([params.lease.task_key])
        return done

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        """``complete`` for several tasks in one transaction."""
        if not items:
            return []
        done = await self._storage.write_waking(
            "sqlite.complete_many",
            lambda c, now, woken: self._complete_batch(c, items, now, woken),
            inline=_short(len(items)),
        )
        self._storage.ended(p.lease.task_key for p, ok in zip(items, done, strict=True) if ok)
        return done

    def _complete_batch(
        self, conn: Conn, items: Sequence[CompleteParams], now: float, woken: set[str]
    ) -> list[bool]:
        done = [self._complete(conn, p, now, woken, bump=False) for p in items]
        # One counter update per queue for the batch, not one per task.
        per_queue = Counter(p.lease.queue for p, ok in zip(items, done, strict=True) if ok)
        for queue, count in per_queue.items():
            self._storage.bump(conn, queue, now, failed=False, count=count)
        return done

    def _move(self, conn: Conn, p: LeaseMove, now: float, woken: set[str]) -> bool:
        """One fenced retry or archive, its counters and its follow-ups."""
        lease = p.lease
        fence = {
            "queue": lease.queue,
            "id": lease.id,
            "token": lease.token,
            "error": p.error,
            "traceback": p.traceback,
            "lost": int(p.lost),
            "expired_by": p.expired_by,
            "now": now,
            **self._storage.timeline.lease_params(),
        }
        if isinstance(p, RetryParams):
            due = now + max(0.0, p.delay)
            values = {
                **fence,
                "next_process_at": due,
                "snooze": int(p.snooze),
                "awaits": p.awaits,
                "keep": int(p.keep),
            }
            cursor = conn.execute(STATEMENTS["retry"], values)
            counted = not p.snooze
        else:
            cursor = conn.execute(
                STATEMENTS["archive"], {**fence, "count_attempt": int(p.count_attempt)}
            )
            counted = p.count_attempt
        keep = isinstance(p, RetryParams) and p.keep
        if not self._ended(conn, lease.queue, cursor, woken, now, keep):
            return False
        if isinstance(p, RetryParams) and (p.delay <= 0 or p.awaits is not None):
            woken.add(lease.queue)  # a wait whose signal came already is pending now
        if counted:
            self._storage.bump(conn, lease.queue, now, failed=True)
        if isinstance(p, ArchiveParams) and p.follow_ups:
            woken.update(self._storage.insert_follow_ups(conn, p.follow_ups, now))
        if isinstance(p, ArchiveParams) and p.group is not None:
            woken.update(self._storage.finish_member(conn, lease.queue, lease.id, p.group, now))
        return True

    async def move_leases(self, moves: Sequence[LeaseMove]) -> list[bool]:
        """Several fenced retry/archive moves in one transaction."""
        if not moves:
            return []
        done = await self._storage.write_waking(
            "sqlite.move_leases",
            lambda c, now, woken: [self._move(c, p, now, woken) for p in moves],
            inline=_short(len(moves)),
        )
        self._storage.ended(ended_by(moves, done))
        return done

    async def retry(self, params: RetryParams) -> bool:
        """State retry for ``delay`` seconds, ``retried`` + 1; fenced by the token."""
        (done,) = await self.move_leases([params])
        return done

    async def archive(self, params: ArchiveParams) -> bool:
        """State archived with the error; fenced by the token."""
        (done,) = await self.move_leases([params])
        return done

    async def report_progress(self, params: ProgressParams) -> bool:
        """Store an attempt's progress and log lines, fenced by its token (the log is read,
        appended to and written back in one write transaction)."""
        ref = {"queue": params.lease.queue, "id": params.lease.id, "token": params.lease.token}

        def run(c: Conn, now: float) -> bool:
            row = c.execute(STATEMENTS["held_logs"], ref).fetchone()
            if row is None:
                return False
            logs = append_lines(row["logs"], params.lines) if params.lines else row["logs"]
            c.execute(
                STATEMENTS["report_progress"], {**ref, "progress": params.progress, "logs": logs}
            )
            return True

        return await self._storage.write("sqlite.report_progress", run, inline=True)

    async def read_steps(self, lease: LeaseRef) -> str | None:
        """The stored steps of a leased task (``None``: none, or the lease is gone)."""
        ref = {"queue": lease.queue, "id": lease.id, "token": lease.token}

        def run(c: Conn) -> str | None:
            row = c.execute(STATEMENTS["read_steps"], ref).fetchone()
            return None if row is None else row["steps"]

        return await self._storage.read("sqlite.read_steps", run)

    async def read_signals(self, lease: LeaseRef) -> str | None:
        """The signals stored on a leased task (``None``: none, or the lease is gone)."""
        ref = {"queue": lease.queue, "id": lease.id, "token": lease.token}

        def run(c: Conn) -> str | None:
            row = c.execute(STATEMENTS["read_signals"], ref).fetchone()
            return None if row is None else row["signals"]

        return await self._storage.read("sqlite.read_signals", run)

    async def signal(self, params: SignalParams) -> str:
        """Store a signal once; wake the task if it waits for it (see the contract)."""
        key = {"queue": params.queue, "id": params.id, "name": params.name}

        def run(c: Conn, now: float, woken: set[str]) -> str:
            row = c.execute(STATEMENTS["signal_task"], {**key, "now": now}).fetchone()
            if row is None:
                raise TaskNotFoundError(f"task {params.id!r} not found in queue {params.queue!r}")
            if row["known"]:  # before "finished": a sender calling again after the end is fine
                return "duplicate"
            if row["state"] in ("completed", "archived"):
                return "finished"
            wake = row["state"] == "waiting" and row["awaits"] == params.name
            values = {**key, "payload": params.payload, "wake": int(wake), "now": now}
            c.execute(STATEMENTS["store_signal"], values)
            if wake:
                woken.add(params.queue)
            return "woken" if wake else "kept"

        return await self._storage.write_waking("sqlite.signal", run)

    async def free_unique(self, params: UniqueRelease) -> bool:
        """Free a twin's unique key while it is in one of ``params.states``."""
        values = {
            "queue": params.queue,
            "id": params.id,
            "key": params.key,
            "states": json.dumps([TaskState(s).value for s in params.states]),
        }
        return await self._storage.write(
            "sqlite.free_unique",
            lambda c, now: c.execute(STATEMENTS["free_unique"], values).rowcount == 1,
        )

    async def replace_twin(self, params: TwinReplace) -> TaskInfo | None:
        """Change a waiting twin in place (see :class:`TwinReplace`)."""
        values = twin_params(params)

        def run(c: Conn, now: float) -> TaskInfo | None:
            row = c.execute(STATEMENTS["replace_twin"], {**values, "now": now}).fetchone()
            return None if row is None else row_to_info(row)

        return await self._storage.write("sqlite.replace_twin", run)

    async def read_snoozes(self, lease: LeaseRef) -> int | None:
        """How often a leased task was snoozed (``None``: the lease is gone)."""
        ref = {"queue": lease.queue, "id": lease.id, "token": lease.token}

        def run(c: Conn) -> int | None:
            row = c.execute(STATEMENTS["read_snoozes"], ref).fetchone()
            return None if row is None else int(row["snoozes"])

        return await self._storage.read("sqlite.read_snoozes", run)

    async def record_steps(self, params: StepsParams) -> bool:
        """Store an attempt's durable steps, fenced by its token."""
        lease = params.lease
        values = {"queue": lease.queue, "id": lease.id, "token": lease.token, "steps": params.steps}

        def run(c: Conn, now: float) -> bool:
            return c.execute(STATEMENTS["record_steps"], values).rowcount == 1

        return await self._storage.write("sqlite.record_steps", run, inline=True)

    async def record_steps_many(self, items: Sequence[StepsParams]) -> list[bool]:
        """Several attempts' durable steps in one write transaction, each fenced by its
        token (one commit for the steps that concurrent handlers recorded together)."""
        rows = [
            {"queue": p.lease.queue, "id": p.lease.id, "token": p.lease.token, "steps": p.steps}
            for p in items
        ]

        def run(c: Conn, now: float) -> list[bool]:
            return [c.execute(STATEMENTS["record_steps"], row).rowcount == 1 for row in rows]

        if not rows:
            return []
        return await self._storage.write("sqlite.record_steps_many", run, inline=True)

    async def requeue(self, lease: LeaseRef, keep: bool = False) -> bool:
        """Back to pending without counting an attempt (graceful shutdown, W7); ``keep``: it
        keeps its sequences' keys (W25)."""
        ref = {"queue": lease.queue, "id": lease.id, "token": lease.token, "keep": int(keep)}
        done = await self._storage.write_waking(
            "sqlite.requeue",
            lambda c, now, woken: self._ended(
                c,
                lease.queue,
                c.execute(STATEMENTS["requeue"], {**ref, "now": now}),
                woken,
                now,
                keep,
            ),
            inline=True,
        )
        if done:
            self._storage.notify([lease.queue])
        return done

    def _ended(
        self,
        conn: Conn,
        queue: str,
        cursor: sqlite3.Cursor,
        woken: set[str],
        now: float,
        keep: bool = False,
    ) -> bool:
        """Whether a fenced move of an active task (``RETURNING limits``) held; if so, its
        limit keys give their running slot back in the same transaction (W13), but for its
        sequences' when it ``keep`` s them (W25), and a task that finished (``RETURNING
        dependents`` too) counts its dependents down."""
        rows = cursor.fetchall()
        if len(rows) != 1:
            return False
        if "dependents" in rows[0].keys() and rows[0]["dependents"] is not None:
            woken.update(self._storage.release_dependents(conn, [rows[0]["dependents"]], now))
        limits = rows[0]["limits"]
        if limits is not None and keep:
            limits = limits_to_json(limiter.given_back(limits_from_json(limits), keep))
        if limits is not None and self._storage.give_back(conn, queue, limits):
            woken.add(queue)  # a held task may be taken now
        return True

    # ------------------------------------------------------------------ maintenance

    async def promote_due(self) -> int:
        """Move due scheduled/retry tasks (claim also takes them directly) and waits for a
        signal whose time ran out to pending."""
        queues = await self._storage.write(
            "sqlite.promote_due",
            lambda c, now: [row[0] for row in c.execute(STATEMENTS["promote_due"], {"now": now})],
        )
        if queues:
            self._storage.notify(set(queues))
        return len(queues)

    async def expired_leases(self, limit: int) -> list[Lease]:
        """Active tasks whose lease expired by now, oldest expiry first."""
        params = {
            "now": self._storage.clock.now(),
            "limit": limit,
            **self._storage.timeline.lease_params(),
        }
        rows = await self._storage.read(
            "sqlite.expired_leases",
            lambda c: c.execute(STATEMENTS["expired_leases"], params).fetchall(),
        )
        return [Lease(row_to_info(row), row["lease_token"]) for row in rows]

    async def delete_archived(self, retention: ArchivedRetention, limit: int) -> int:
        """Delete up to ``limit`` archived tasks past their queue's archived retention."""
        if retention.keeps_all or limit <= 0:
            return 0
        params = {
            "keep": json.dumps(dict(retention.queues)),
            "default": retention.default,
            "limit": limit,
        }

        def run(conn: Conn, now: float) -> int:
            deleted: int = conn.execute(
                STATEMENTS["delete_archived"], {**params, "now": now}
            ).rowcount
            return deleted

        return await self._storage.write("sqlite.delete_archived", run)

    async def delete_expired(self, limit: int) -> int:
        """Delete up to ``limit`` completed tasks past their retention."""

        def run(conn: Conn, now: float) -> int:
            conn.execute(STATEMENTS["prune_minute_stats"], {"before": now - MINUTE_COUNTS_KEEP})
            # Finished groups past their retention go in the same bounded way.
            conn.execute(STATEMENTS["delete_expired_group_members"], {"now": now, "limit": limit})
            conn.execute(STATEMENTS["delete_expired_groups"], {"now": now, "limit": limit})
            deleted: int = conn.execute(
                STATEMENTS["delete_expired"], {"now": now, "limit": limit}
            ).rowcount
            # Then workflow records none of whose nodes' tasks is left.
            conn.execute(STATEMENTS["delete_expired_workflows"], {"now": now, "limit": limit})
            return deleted

        return await self._storage.write("sqlite.delete_expired", run)

    # ------------------------------------------------------------------ wake-up

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait for an enqueue into ``queues``: at once for this process (shared registry)
        and for other processes on this machine (a datagram, see ``wakeup.py``); within
        ``poll_interval`` in any case (``PRAGMA data_version`` changes), should a datagram
        be lost.

        Level-triggered: work announced since this broker's last claim returns at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        waiter = Waiter(loop, queues)
        self._storage.mailbox.park(waiter)  # before looking: nothing slips between
        watching = False
        try:
            if self._storage.mailbox.take(queues):
                return True
            watching = self._storage.watch(loop)  # before the data_version look, see watch()
            version = await self._storage.call("sqlite.wait_for_work", _data_version, inline=True)
            if self._storage.seen_version is not None and version != self._storage.seen_version:
                self._storage.seen_version = version  # another connection committed since we looked
                return True
            self._storage.seen_version = version
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                try:
                    async with asyncio.timeout(min(self._storage.poll_interval, remaining)):
                        await waiter.event.wait()
                    self._storage.mailbox.take(queues)
                    return True
                except TimeoutError:
                    pass
                version = await self._storage.call(
                    "sqlite.wait_for_work", _data_version, inline=True
                )
                if version != self._storage.seen_version:
                    self._storage.seen_version = version
                    return True
        finally:
            if watching:
                self._storage.unwatch()
            self._storage.mailbox.unpark(waiter)

    @asynccontextmanager
    async def watch_end(self, queue: str, task_id: str) -> AsyncIterator[EndWatch]:
        """Subscribe to the end of one task: at once for this process (shared registry),
        within ``poll_interval`` for other processes (``PRAGMA data_version`` changed: the
        wait returns and the caller reads the task again)."""
        watches = mailbox.watches(self._storage.key)
        async with watches.watching(mailbox.end_key(queue, task_id)) as local:
            version = await self._storage.call("sqlite.watch_end", _data_version, inline=True)
            yield _FileWatch(self._storage, local, version)

    # ------------------------------------------------------------------ workers

    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert or refresh the worker's row (its heartbeat); makes its queues known."""

        def body(conn: Conn, now: float) -> None:
            conn.execute(
                STATEMENTS["upsert_worker"],
                {
                    "id": info.id,
                    "host": info.host,
                    "pid": info.pid,
                    "queues": json.dumps(info.queues, separators=(",", ":")),
                    "concurrency": info.concurrency,
                    "started_at": info.started_at,
                    "now": now,
                    "active": info.active,
                    "strict": int(info.strict),
                },
            )
            for queue in info.queues:
                conn.execute(STATEMENTS["ensure_queue"], {"queue": queue, "now": now})
            conn.execute(STATEMENTS["forget_dead_workers"], {"before": now - FORGET_WORKERS_AFTER})

        await self._storage.write("sqlite.register_worker", body)

    async def durability_warnings(self) -> list[str]:
        """None to report: a commit is durable (see docs/guarantees.md)."""
        return []

    async def unregister_worker(self, worker_id: str) -> None:
        """Remove the worker's row at shutdown."""
        await self._storage.write(
            "sqlite.unregister_worker",
            lambda c, _: c.execute(STATEMENTS["delete_worker"], {"id": worker_id}),
        )


class _FileWatch:
    """A task-end watch on an SQLite file: this process's notifications, and commits of
    other processes seen through ``PRAGMA data_version`` (the wake-up channel workers use)."""

    def __init__(self, storage: SQLiteStorage, local: mailbox.Watch, version: int) -> None:
        self._storage = storage
        self._local = local
        self._version = version

    async def wait(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            remaining = deadline - loop.time()
            if await self._local.wait(min(self._storage.poll_interval, max(0.0, remaining))):
                return True
            version = await self._storage.call("sqlite.watch_end", _data_version, inline=True)
            if version != self._version:
                self._version = version  # another process committed: maybe this task's end
                return True
            if remaining <= self._storage.poll_interval:
                return False


#: The most tasks a call may touch and still run on the caller's thread (see
#: ``SQLiteStorage.call``): a few milliseconds of SQL at most. A rescuer's batch of expired
#: leases or a worker of hundreds of slots goes to the database thread.
SHORT_CALL_TASKS = 100


def _short(tasks: int) -> bool:
    return tasks <= SHORT_CALL_TASKS


def _data_version(conn: Conn) -> int:
    return int(conn.execute(STATEMENTS["data_version"]).fetchone()[0])


def _may_claim(conn: Conn, queue: str, now: float) -> tuple[bool, float | None]:
    """Read only, before any write lock: whether a claim of ``queue`` may lease a task or let
    held ones back (a key they wait on has room); if not, when a token comes for such a key.

    While every key with held tasks is full, idle workers thus poll without the write lock
    (WAL readers contend with nobody); the end of an attempt that frees a slot wakes them
    (the mailbox in this process, a datagram and ``data_version`` in others)."""
    if conn.execute(STATEMENTS["any_claimable"], {"queue": queue, "now": now}).fetchone()[0]:
        return True, None
    rows = conn.execute(STATEMENTS["waiting_limits"], {"queue": queue})
    return limiter.outlook((limiter.stored(row) for row in rows), now)


class _LimitCounters:
    """The flow-control counters of one queue that a claim touches, read once and written
    back before the lease (inside the claim's transaction, W13)."""

    def __init__(self, conn: Conn, queue: str, now: float) -> None:
        self._conn = conn
        self._queue = queue
        self._now = now
        self._counters: dict[str, limiter.Counter] = {}
        self._dirty: set[str] = set()
        #: How many of a fair template's tasks :meth:`turns` reads.
        self.look = FAIR_LOOK

    def _load(self, keys: Sequence[str]) -> None:
        missing = [k for k in keys if k not in self._counters]
        if not missing:
            return
        rows = self._conn.execute(
            STATEMENTS["limit_counters"], {"queue": self._queue, "keys": json.dumps(missing)}
        )
        for row in rows:
            self._counters[row["key"]] = limiter.stored(row)

    def let_back(self) -> None:
        """Held tasks of keys with room again rejoin the claimable set."""
        for row in self._conn.execute(
            STATEMENTS["waiting_limits"], {"queue": self._queue}
        ).fetchall():
            counter = self._counters[row["key"]] = limiter.stored(row)
            room = counter.room(self._now)
            if room <= 0:
                continue
            moved = self._conn.execute(
                STATEMENTS["let_back"], {"queue": self._queue, "key": row["key"], "room": room}
            ).rowcount
            if moved < room:  # none left held on it
                counter.waiting = False
                self._dirty.add(row["key"])

    def admit(self, rowid: int, specs: tuple[LimitSpec, ...], kept: bool) -> bool:
        """Count one start of a task with ``specs`` (``kept``: it holds its sequences' keys,
        W25), or hold it on its first full key."""
        self._load([s.key for s in specs])
        full = limiter.admit(specs, self._counters, self._now, kept)
        if full is not None:
            self._conn.execute(STATEMENTS["hold_task"], {"key": full, "rowid": rowid})
            self._dirty.add(full)
            return False
        self._dirty.update(spec.key for spec in specs)
        return True

    def turns(self, template: str) -> list[sqlite3.Row]:
        """W22: the claimable tasks of a fair template in turn order, as far as one claim
        may take them."""
        return self._conn.execute(
            STATEMENTS["fair_candidates"],
            {"queue": self._queue, "template": template, "limit": self.look},
        ).fetchall()

    def started(self, template: str, turn: int) -> None:
        """W22: a task of ``template`` with ``turn`` started: the template's round."""
        self._conn.execute(
            STATEMENTS["fair_round"], {"queue": self._queue, "template": template, "turn": turn}
        )

    def save(self) -> None:
        for key in self._dirty:
            c = self._counters[key]
            self._conn.execute(
                STATEMENTS["save_limit_counter"],
                {
                    "queue": self._queue,
                    "key": key,
                    "running": c.running,
                    "concurrency": c.concurrency,
                    "rate": c.rate,
                    "per": c.per,
                    "tokens": c.tokens,
                    "refilled_at": c.refilled_at,
                    "waiting": int(c.waiting),
                    "need": c.need,
                },
            )
        self._dirty.clear()

    def wake_at(self) -> float | None:
        """When a token comes for a key with held tasks."""
        return limiter.wake_at(self._counters.values(), self._now)


#: W22: how many of a fair template's tasks a claim reads at a time past the tasks it wants
#: (read again when they are used up: held tasks have left the index then, and the tasks
#: chosen but not yet leased are fewer than it wants, so a read again finds the next turn).
#: One: a row read costs about 10k instructions, and a claim of one fair task read five
#: (1.11x a limited claim's instructions, against 1.08x reading two).
FAIR_LOOK = 1


def _rowid(row: sqlite3.Row) -> int:
    return int(row["rowid"])


def _fair_template(row: sqlite3.Row) -> str | None:
    return row["fair_template"]  # type: ignore[no-any-return]
