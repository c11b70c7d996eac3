"""The PostgreSQL broker: one task table, SKIP LOCKED claims, LISTEN/NOTIFY wake-ups and
enqueue inside the caller's transaction (E8). See docs/brokers/postgresql.md."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence, Set
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncRawCursor
from psycopg.rows import tuple_row

from durq.brokers import limiter
from durq.brokers.batcher import enqueue_coalescer
from durq.brokers.contract import (
    CAP_COMPLETE_AND_CLAIM,
    CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
    CAP_CROSS_PROCESS_NOTIFY,
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    CAP_CROSS_QUEUE_GROUPS,
    CAP_DEPENDENCIES,
    CAP_MULTI_PROCESS,
    CAP_SYNC_CONNECTION_ENQUEUE,
    CAP_TRANSACTIONAL_ENQUEUE,
    EndWatch,
)
from durq.brokers.mailbox import end_key
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
from durq.brokers.postgres.admin import PostgresAdmin
from durq.brokers.postgres.rows import (
    CLAIM_DONE_IDS,
    CLAIM_DONE_QUEUES,
    CLAIM_DONE_WAKE,
    CLAIM_DONE_WATCHED,
    CLAIM_DUE,
    CLAIM_HELD,
    CLAIM_ID,
    CLAIM_LIMITED,
    CLAIM_MOVED,
    CLAIM_NEXT_AT,
    CLAIM_PRIORITY,
    CLAIM_QUEUE,
    CLAIM_SEQ,
    CLAIM_STARTED,
    CLAIM_TOKEN,
    CLAIM_UNTIL,
    Row,
    claimed_info,
)
from durq.brokers.postgres.storage import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_MAX,
    DEFAULT_POOL_MAX_IDLE,
    AsyncConn,
    PostgresStorage,
)
from durq.brokers.postgres.wakeup import EndListener, Listener
from durq.brokers.sqlfiles import twin_params
from durq.brokers.sqlrows import limits_of, row_to_info
from durq.brokers.views import FORGET_WORKERS_AFTER, MINUTE_COUNTS_KEEP, WorkerInfo
from durq.clock import SYSTEM_CLOCK, Clock, to_datetime, utc_day
from durq.errors import ConfigurationError, TaskNotFoundError
from durq.progress import MAX_LOG_LINES
from durq.states import TaskState
from durq.task import LimitSpec, TaskInfo

_T = TypeVar("_T")

log = logging.getLogger("durq.brokers.postgres")

# Statements of the maintenance calls touch at most this many rows each, so none of them holds
# locks on a large part of a big table; the calls loop until the work is done.
_BATCH = 1000


class PostgresBroker:
    """durq on PostgreSQL (psycopg 3, async, with a connection pool): the hot path here, the
    inspector in :class:`PostgresAdmin`, both on one :class:`PostgresStorage`.

    URL: ``postgresql://user@host:port/db?schema=durq`` (``schema`` defaults to ``durq``;
    ``pool_min``/``pool_max`` size the pool, ``pool_max_idle`` (seconds) is how long an unused
    pooled connection stays open; other parameters go to libpq)."""

    name = "postgres"
    capabilities = frozenset(
        {
            CAP_MULTI_PROCESS,
            CAP_TRANSACTIONAL_ENQUEUE,
            CAP_CROSS_PROCESS_NOTIFY,
            CAP_COMPLETE_AND_CLAIM,
            CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
            CAP_CROSS_QUEUE_FOLLOW_UPS,
            CAP_CROSS_QUEUE_GROUPS,
            CAP_SYNC_CONNECTION_ENQUEUE,
            CAP_DEPENDENCIES,
        }
    )

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "durq",
        clock: Clock = SYSTEM_CLOCK,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_min: int = 1,
        pool_max: int = DEFAULT_POOL_MAX,
        pool_max_idle: float = DEFAULT_POOL_MAX_IDLE,
        pgbouncer: bool | None = None,
        listen_url: str | None = None,
    ) -> None:
        self._storage = PostgresStorage(
            dsn,
            schema=schema,
            clock=clock,
            connect_timeout=connect_timeout,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_max_idle=pool_max_idle,
            pgbouncer=pgbouncer,
            listen_url=listen_url,
        )
        self.admin = PostgresAdmin(self._storage)
        self._listener: Listener | None = None
        self._batcher = enqueue_coalescer(self._enqueue_one, self.enqueue_many)
        self._end_listener: EndListener | None = None
        self._polling_warned = False
        self._check_polling()
        self._storage.pooler_found = self._check_polling
        # When each queue was last claimed from (monotonic): a wake-up that arrives between a
        # short claim and the next wait makes that wait return at once (level-triggered).
        self._claim_marks: dict[str, float] = {}
        #: Queues where the last claim saw due tasks with limits or held tasks with room:
        #: their claims go straight to the claim of limited work (W13).
        self._limited: set[str] = set()
        #: Per queue: when a task held on a rate gets its token (from the last claim's
        #: answer). From then on the claim of limited work goes first, as the claim order
        #: wants: the one statement would lease unlimited tasks of later queues first.
        self._token_at: dict[str, float] = {}

    @property
    def _polling(self) -> bool:
        # LISTEN through a transaction pooler hears nothing: without a direct listen_url,
        # workers poll (warned once, when a worker first claims). Known from the URL, or
        # once connected (the storage finds a pooler the URL did not name).
        return self._storage.pgbouncer and self._storage.listen_dsn is None

    def _check_polling(self) -> None:
        if self._polling:
            self.capabilities = type(self).capabilities - {CAP_CROSS_PROCESS_NOTIFY}

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> PostgresBroker:
        """Build (without connecting) a broker from ``postgresql://…?schema=…``."""
        dsn, options = PostgresStorage.parse_url(url)
        return cls(dsn, clock=clock, **options)

    #: Split a broker URL into the libpq DSN and durq's own options.
    parse_url = staticmethod(PostgresStorage.parse_url)

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with (the server's, once measured)."""
        return self._storage.clock

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds this broker's tables."""
        return self._storage.schema

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this schema."""
        return self._storage.channel

    async def connect(self) -> None:
        """Open the pool (idempotent). Raises BrokerUnavailableError or SchemaError."""
        await self._storage.connect()

    async def migrate(self) -> list[str]:
        """Apply the missing migrations under an advisory lock; returns their names.

        Safe when several processes run it at once: the lock serialises them and the second
        finds nothing left to do. A schema newer than this code is refused (SchemaError)."""
        return await self._storage.migrate()

    async def pending_migrations(self) -> list[str]:
        """The migrations :meth:`migrate` would apply, read without writing."""
        return await self._storage.pending_migrations()

    async def ping(self) -> None:
        """One cheap round trip; raises BrokerUnavailableError."""
        await self._storage.ping()

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Release every connection (idempotent)."""
        for listener in (self._listener, self._end_listener):
            if listener is not None:
                await listener.close()
        self._listener = self._end_listener = None
        await self._storage.close()

    # ------------------------------------------------------------------ enqueue

    async def enqueue(self, params: EnqueueParams, *, connection: Any = None) -> TaskInfo:
        """Create one task; the database's constraints enforce E3 and E4.

        ``connection``: a psycopg ``AsyncConnection`` or ``Connection`` of the caller; the
        task is written in its transaction (no commit here) and exists only if it commits.
        Without one, calls made while another is in flight go together as one multi-row
        insert (see :mod:`durq.brokers.batcher`)."""
        if connection is None:
            return await self._batcher.send(params)
        (outcome,) = await self.enqueue_many([params], connection=connection)
        return _unwrap(outcome)

    async def _enqueue_one(self, params: EnqueueParams) -> TaskInfo:
        (outcome,) = await self.enqueue_many([params])
        return _unwrap(outcome)

    async def enqueue_group(self, params: GroupParams) -> list[TaskInfo]:
        """The group's record, every member and the waiting follow-up in one transaction,
        or nothing."""
        async with self._storage.connection("enqueue_group") as conn, conn.transaction():
            infos = await self._storage.insert_group(conn, params)
        self._storage.notify_created(
            [EnqueueOutcome(p, info=i) for p, i in zip(params.members, infos, strict=True)]
        )
        return infos

    async def enqueue_graph(
        self, items: Sequence[EnqueueParams], workflow: WorkflowParams | None = None
    ) -> list[TaskInfo]:
        """Every task of a graph, waiting for its earlier items, and the workflow's record
        in one transaction, or nothing."""
        async with self._storage.connection("enqueue_graph") as conn, conn.transaction():
            infos = await self._storage.insert_graph(conn, items, workflow)
        self._storage.notify_created(
            [EnqueueOutcome(p, info=i) for p, i in zip(items, infos, strict=True)]
        )
        return infos

    async def enqueue_many(
        self, items: Sequence[EnqueueParams], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """Create many tasks with one multi-row insert; one outcome per item (E9)."""
        if not items:
            return []
        if any(p.after for p in items):
            return await self._enqueue_after(items, connection)
        result: list[EnqueueOutcome]
        if connection is None:
            # Autocommit: each statement commits at once; notify after the commit (see the
            # `enqueue` query for why not inside it).
            plan = self._storage.plan(items, None, alone=True)
            with self._storage.notifier.writing():
                async with self._storage.connection("enqueue") as conn:
                    result = await self._storage.drive(conn, plan)
                self._storage.notify_created(result)
            return result
        # The caller's transaction: the notification must wait for *its* commit.
        plan = self._storage.plan(items, self._storage.channel)
        if isinstance(connection, psycopg.AsyncConnection):
            async with self._storage.errors("enqueue"):
                result = await self._storage.drive(connection, plan)
            return result
        if isinstance(connection, psycopg.Connection):
            # A sync connection blocks: run it off the event loop.
            return await asyncio.to_thread(self.enqueue_many_sync_in, items, connection)
        raise ConfigurationError(
            "connection must be a psycopg Connection or AsyncConnection, "
            f"not {type(connection).__name__}"
        )

    async def _enqueue_after(
        self, items: Sequence[EnqueueParams], connection: Any
    ) -> list[EnqueueOutcome]:
        """Items of which some wait for others (``after=``): each in a transaction of its
        own (a savepoint in the caller's), its dependencies listing it first."""
        if connection is not None and not isinstance(connection, psycopg.AsyncConnection):
            raise ConfigurationError("after= with connection= needs a psycopg AsyncConnection")
        outcomes: list[EnqueueOutcome] = []
        if connection is not None:
            async with self._storage.errors("enqueue"):
                for p in items:
                    outcomes.append(await self._storage.insert_after(connection, p))
            return outcomes  # the caller's commit decides; workers hear of it by polling
        async with self._storage.connection("enqueue") as conn:
            for p in items:
                outcomes.append(await self._storage.insert_after(conn, p))
        self._storage.notify_created(outcomes)
        return outcomes

    def enqueue_sync_in(
        self, params: EnqueueParams, connection: psycopg.Connection[Any]
    ) -> TaskInfo:
        """Create one task inside the caller's sync psycopg transaction (E8); no commit."""
        (outcome,) = self.enqueue_many_sync_in([params], connection)
        return _unwrap(outcome)

    def enqueue_many_sync_in(
        self, items: Sequence[EnqueueParams], connection: psycopg.Connection[Any]
    ) -> list[EnqueueOutcome]:
        """``enqueue_many`` inside the caller's sync psycopg transaction (E8); no commit."""
        if not items:
            return []
        if any(p.after for p in items):
            raise ConfigurationError("after= with connection= needs a psycopg AsyncConnection")
        plan = self._storage.plan(items, self._storage.channel)
        with self._storage.errors_sync("enqueue"):
            result: list[EnqueueOutcome] = self._storage.drive_sync(connection, plan)
        return result

    # ------------------------------------------------------------------ claim and leases

    async def claim(self, params: ClaimParams) -> list[Lease]:
        """Lease up to ``limit`` due tasks in one round trip (SKIP LOCKED: never twice)."""
        if not params.queues or params.limit <= 0:
            return []
        _, leases, _ = await self._claim(params)
        return leases

    async def complete_and_claim(
        self, items: Sequence[CompleteParams], claim: ClaimParams
    ) -> tuple[list[bool], list[Lease]]:
        """The completions and the claim in one statement (complete_claim; for queues with
        limited work the complete statement ahead of the claim's in one pipeline): one round
        trip, one transaction. Plain completions only: follow-ups and group outcomes
        complete in a transaction of their own."""
        values = self._complete_values(items)
        rows, leases, served = await self._claim(claim, values)
        if rows is None:  # the claim's deadlock rolled the completions back: alone, then
            rows = await self._storage.fetch("complete", "complete", values)
        return self._completed(items, rows, served), leases

    async def _claim(
        self,
        params: ClaimParams,
        complete: dict[str, Any] | None = None,
    ) -> tuple[list[Row] | None, Claimed, Set[str]]:
        """The claim, after the complete statement with ``complete`` when given. Returns
        the completed rows (``None`` when a deadlock rolled them back with the claim), the
        leases, and the queues where those completions freed a limit key with held tasks
        that this claim already looked at again: this worker need not be woken for them."""
        queues = list(dict.fromkeys(params.queues))
        mark = time.monotonic()
        for queue in queues:
            self._claim_marks[queue] = mark
        self._start_listening()
        # Queues where limited work was seen go straight to the claim of limited work (the
        # limiter decides in Python, in the claim's transaction); the others take
        # complete_claim, which only says whether that claim is needed.
        now = self._storage.now()
        limited_mode = not self._limited.isdisjoint(queues) or any(
            self._token_at.get(q, math.inf) <= now for q in queues
        )
        values = self._claim_values(queues, params)
        if self._storage.warm_up is None:  # this broker claims: warm its new connections up
            self._storage.warm_up = functools.partial(
                self._warm_up, self._claim_values([_WARM_UP_QUEUE], params)
            )
        freed: set[str] = set()
        places: dict[tuple[str, str], tuple[Any, ...]] = {}
        if limited_mode:
            # The completions go in the claim's first round trip and transaction: it sees
            # the slots they freed.
            completed, rows, wake_at, places = await self._claim_limited(
                queues, params, [], complete
            )
            if completed is not None:
                freed.update(queues)
        else:
            completed, rows, due, moved = await self._complete_claim(values, complete)
            if due:
                # Due scheduled/retry rows wait: nothing was leased (they may come first);
                # forward them and claim in one more round trip.
                rows = await self._forward_and_claim(values)
            elif moved:
                rows = await self._claim_again(values, rows)
            # A key these completions freed is not seen by the claim of the same statement.
            freed.update(r["queue"] for r in completed or () if r["wake"])
            freed.intersection_update(queues)
            limited, wake_at = _held_answer(rows)
            rows = [r for r in rows if r[0] is not None]  # one row of NULLs: nothing leased
            if (limited or freed) and len(rows) < params.limit:
                # Held tasks wait on a key with room (or one these completions freed): the
                # limited claim takes them now, rather than after this worker's own wake-up
                # and another claim.
                self._limited.update(queues)
                _, rows, wake_at, places = await self._claim_limited(queues, params, rows, None)
            else:
                freed.clear()
        for queue in queues:
            if wake_at is None:
                self._token_at.pop(queue, None)
            else:
                self._token_at[queue] = wake_at
        if len(rows) > 1:
            # UPDATE … RETURNING has no order: restore queue order, then the claim order
            # (a fair template's task in the place of the task it was taken for, W22).
            order = {q: i for i, q in enumerate(queues)}
            rows.sort(
                key=lambda r: (
                    order[r[CLAIM_QUEUE]],
                    places.get(
                        (r[CLAIM_QUEUE], r[CLAIM_ID]),
                        (-r[CLAIM_PRIORITY], r[CLAIM_NEXT_AT], r[CLAIM_SEQ], 0),
                    ),
                )
            )
        # Start and lease expiry as the server read them (a claim of limited tasks is a
        # statement of its own, with its own).
        worker = params.worker_id
        leases = Claimed(
            (
                Lease(
                    task=claimed_info(
                        r, to_datetime(r[CLAIM_STARTED]), to_datetime(r[CLAIM_UNTIL]), worker
                    ),
                    token=r[CLAIM_TOKEN],
                )
                for r in rows
            ),
            wake_at,
        )
        return completed, leases, freed

    def _claim_values(self, queues: list[str], params: ClaimParams) -> dict[str, Any]:
        return {
            "queues": queues,
            "limit": params.limit,
            "take": params.limit,
            "now": self._storage.sql_now(),
            "lease_seconds": float(params.lease_seconds),
            "worker_id": params.worker_id,
            "forward": max(params.limit, CLAIM_FORWARD),
        }

    async def _warm_up(self, values: dict[str, Any], conn: AsyncConn) -> None:
        """Run the idle worker's claim once on a new pooled connection, on a queue no task
        can be in: prepared there now, with its plan and the server's caches warm, it is
        not planned on the claim that picks up a task. A busy worker claims with its acks
        (complete_claim) and spreads them over the pool's connections in turn: after a busy
        spell, the first idle claim on each of them took 1.5-3 ms more. A failure leaves the
        connection as it was (the claim prepares the statement then). ``values``: a claim's,
        with a queue of its own (their types select the prepared statement)."""
        statement = self._storage.raw_statements["claim"]
        try:
            cur = AsyncRawCursor(conn, row_factory=tuple_row)
            await cur.execute(statement.text, statement.params({**values, "check_due": True}))
        except psycopg.Error as exc:
            log.debug("warming a new connection up failed: %s", exc)

    async def _complete_claim(
        self, values: dict[str, Any], complete: dict[str, Any] | None
    ) -> tuple[list[Row] | None, list[tuple[Any, ...]], bool, bool]:
        """complete_claim: the completions and the claim in one statement, one round trip.
        The completed rows (``None`` when a deadlock rolled them back with the claim), the
        claim's rows, whether due scheduled/retry rows wait to be forwarded, and whether a
        row it locked had moved (see :meth:`_claim_again`)."""
        if complete is not None and complete["ids"]:
            query, params = "complete_claim", {**values, **complete, "check_due": True}
        else:  # nothing to complete: the claim alone, a smaller statement
            query, params = "claim", {**values, "check_due": True}
        rows = await self._claim_rows(query, params)
        if rows is None:
            return None, [], False, False
        first = rows[0]
        wake = set(first[CLAIM_DONE_WAKE] or ())
        watched = set(first[CLAIM_DONE_WATCHED] or ())
        # A waiting task released into a queue none of these completions was in.
        if wake - set(first[CLAIM_DONE_QUEUES] or ()):
            self._wake(wake - set(first[CLAIM_DONE_QUEUES] or ()))
        completed: list[Row] = [
            {"queue": queue, "id": task_id, "wake": queue in wake, "watched": task_id in watched}
            for queue, task_id in zip(
                first[CLAIM_DONE_QUEUES] or (), first[CLAIM_DONE_IDS] or (), strict=True
            )
        ]
        return completed, rows, bool(first[CLAIM_DUE]), bool(first[CLAIM_MOVED])

    async def _claim_again(
        self, values: dict[str, Any], rows: list[tuple[Any, ...]]
    ) -> list[tuple[Any, ...]]:
        """``rows`` and those of one more claim, for what a claim could not lease: a row it
        locked that another transaction had changed since the statement's snapshot (the
        lease is written through the row's ctid, which then points to a version that
        snapshot cannot see). The next statement's snapshot sees the row as it is now."""
        leased = [r for r in rows if r[0] is not None]
        # A moved row is one of at most `limit` locked, so at least one slot is left.
        want = values["limit"] - len(leased)
        _, more, _, _ = await self._complete_claim({**values, "limit": want, "take": want}, None)
        return leased + more

    async def _claim_statements(
        self, what: str, run: Callable[[AsyncConn], Awaitable[_T]], on_deadlock: _T
    ) -> _T:
        """``run`` on a pooled connection. A deadlock rolls its statements back and is never
        fatal (nor expected: claims never wait for a counter, outcomes lock theirs in key
        order); it answers ``on_deadlock`` and the worker claims again later."""
        async with self._storage.connection("claim") as conn:
            try:
                return await run(conn)
            except psycopg.errors.DeadlockDetected:
                log.debug("%s met a deadlock; trying again later", what)
                return on_deadlock

    async def _claim_rows(self, query: str, values: dict[str, Any]) -> list[tuple[Any, ...]] | None:
        """One claim statement's rows, as tuples; ``None`` when a deadlock rolled it back."""
        statement = self._storage.raw_statements[query]

        async def run(conn: AsyncConn) -> list[tuple[Any, ...]] | None:
            cur = AsyncRawCursor(conn, row_factory=tuple_row)
            await cur.execute(statement.text, statement.params(values))
            return await cur.fetchall()

        return await self._claim_statements(query, run, None)

    async def _forward_and_claim(self, values: dict[str, Any]) -> list[tuple[Any, ...]]:
        """claim_forward, then claim (no check for due rows: a backlog past the forwarded
        batch waits for the next claim) in the same round trip
        and transaction, which sees the rows it moved; the claim's rows."""
        claim = {**values, "check_due": False}
        statement = self._storage.raw_statements["claim"]

        async def run(conn: AsyncConn) -> list[tuple[Any, ...]]:
            async with conn.pipeline():
                await conn.execute(self._storage.statements["claim_forward"], values)
                cur = AsyncRawCursor(conn, row_factory=tuple_row)
                await cur.execute(statement.text, statement.params(claim))
            return await cur.fetchall()

        return await self._claim_statements("forwarding due tasks", run, [])

    async def _claim_limited(
        self,
        queues: list[str],
        params: ClaimParams,
        out: list[tuple[Any, ...]],
        complete: dict[str, Any] | None,
    ) -> tuple[
        list[Row] | None,
        list[tuple[Any, ...]],
        float | None,
        dict[tuple[str, str], tuple[Any, ...]],
    ]:
        """W13: rounds of the claim of limited work after ``out`` (up to ``params.limit``),
        each one transaction, while a round held tasks and more may be due. Each looks
        further past the free slots than the one before (``_LOOK_AHEAD``, then twice as
        far...), so a long backlog on a full key is held in a few rounds. The first round
        stores ``complete`` first. Returns the completed rows (``[]`` without ``complete``,
        ``None`` when a deadlock rolled them back), the leased rows, when a token comes
        for a held task, and the place in claim order of fair tasks taken in another's."""
        look = _LOOK_AHEAD
        rows = list(out)
        completed: list[Row] | None = []
        wake_at: float | None = None
        places: dict[tuple[str, str], tuple[Any, ...]] = {}
        for n in range(_LIMITED_ROUNDS):
            want = params.limit - len(rows)
            run = functools.partial(
                self._limited_round, queues, params, want, look, complete if n == 0 else None
            )
            answer = await self._claim_statements("claim of limited tasks", run, None)
            if answer is None:
                if n == 0 and complete is not None:
                    completed = None
                break
            done, leased, admission = answer
            if n == 0 and complete is not None:
                completed = done
            if not admission.seen:
                self._limited.difference_update(queues)
            rows.extend(leased)
            places.update(admission.places)
            wake_at = admission.wake_at()
            if not admission.again(len(leased)) or len(rows) >= params.limit:
                break
            look = min(2 * look, _LOOK_AHEAD_MAX)
        return completed, rows, wake_at, places

    async def _limited_round(
        self,
        queues: list[str],
        params: ClaimParams,
        want: int,
        look: int,
        complete: dict[str, Any] | None,
        conn: AsyncConn,
    ) -> tuple[list[Row], list[tuple[Any, ...]], _Admission]:
        """One transaction of the claim of limited work, in two round trips (three when a
        key has no counter yet). First the completions (when given), the forwarding step,
        the due rows, the counters of keys with held tasks and the held tasks of those with
        a free slot, all locked; then, after the limiter has decided, the leases, holds and
        counters are written and committed."""
        q = self._storage.statements
        limit = want + look
        values = {
            "queues": queues,
            "limit": limit,
            "now": self._storage.sql_now(),
            "forward": max(params.limit, CLAIM_FORWARD),
        }
        done = leases = None
        async with conn.pipeline():
            async with conn.transaction():
                if complete is not None:
                    done = await conn.execute(q["complete"], complete)
                await conn.execute(q["claim_forward"], values)
                clock = await conn.execute(q["claim_now"], values)
                due = await conn.execute(q["limited_due"], values)
                waiting = await conn.execute(q["waiting_limits"], values)
                held = await conn.execute(q["held_tasks"], {**values, "limit": want})
                fair = await conn.execute(
                    q["fair_due"], {**values, "fair_limit": want + _FAIR_LOOK_AHEAD}
                )
                row = await clock.fetchone()  # the first round trip
                assert row is not None
                admission = _Admission(queues, float(row["now"]), want, limit)
                admission.read(await due.fetchall(), await waiting.fetchall())
                admission.held(await held.fetchall())
                admission.fair(await fair.fetchall())
                missing = admission.missing()
                if missing:
                    # Keys no claim has counted (created as the limiter makes them), or
                    # that no task is held on.
                    await conn.execute(q["create_limits"], admission.fresh_params(missing))
                    lock = await conn.execute(q["lock_limits"], admission.key_params(missing))
                    admission.locked(await lock.fetchall())
                admission.decide()
                if admission.chosen:
                    leases = conn.cursor(row_factory=tuple_row)
                    await leases.execute(
                        q["lease_rows"],
                        {
                            "ctids": admission.chosen,
                            "now": admission.now,
                            "lease_seconds": float(params.lease_seconds),
                            "worker_id": params.worker_id,
                        },
                    )
                if admission.holds:
                    await conn.execute(q["hold_rows"], admission.hold_params())
                if admission.dirty:
                    await conn.execute(q["save_limits"], admission.save_params())
                if admission.rounds:
                    await conn.execute(q["fair_rounds"], admission.round_params())
                if admission.settle:
                    await conn.execute(q["settle_limits"], admission.settle_params())
        # Read after the commit, which the pipeline's end sent with the writes: one round
        # trip for the writes and the commit.
        leased = await leases.fetchall() if leases is not None else []
        if len(leased) < len(admission.chosen):
            # A row it locked was not written (a trigger refused it): the starts it counted
            # come back. Counted meanwhile, they only held other tasks back.
            await self._give_back(conn, admission.not_leased(leased))
        return (await done.fetchall() if done is not None else []), leased, admission

    async def _give_back(self, conn: AsyncConn, starts: dict[tuple[str, str], int]) -> None:
        """Give back the running slots ``starts`` (by queue and key) counted for rows a
        claim could not lease."""
        keys = sorted(starts)
        values = {
            "queues": [q for q, _ in keys],
            "keys": [k for _, k in keys],
            "ns": [starts[k] for k in keys],
        }
        await conn.execute(self._storage.statements["give_back_limits"], values)

    async def extend_leases(self, leases: Sequence[LeaseRef], lease_seconds: float) -> LeaseReport:
        """Heartbeat: push the expiry of every held lease; report lost ones and cancel asks."""
        if not leases:
            return LeaseReport()
        rows = await self._storage.fetch(
            "extend_leases",
            "extend_leases",
            {
                "queues": [lease.queue for lease in leases],
                "ids": [lease.id for lease in leases],
                "tokens": [lease.token for lease in leases],
                "now": self._storage.sql_now(),
                "lease_seconds": float(lease_seconds),
            },
        )
        held = {(r["queue"], r["id"]) for r in rows}
        return LeaseReport(
            lost=frozenset(lease.id for lease in leases if (lease.queue, lease.id) not in held),
            cancel=frozenset(r["id"] for r in rows if r["cancel_requested"]),
        )

    async def complete(self, params: CompleteParams) -> bool:
        """Finish a task; ``False`` (and no change) if the lease is no longer held."""
        (done,) = await self.complete_many([params])
        return done

    def _complete_values(self, items: Sequence[CompleteParams]) -> dict[str, Any]:
        """The parameters of the complete statement for ``items``."""
        return {
            "task_queues": [i.lease.queue for i in items],
            "ids": [i.lease.id for i in items],
            "tokens": [i.lease.token for i in items],
            "results": [None if i.result is None else bytes(i.result) for i in items],
            "retentions": [float(i.retention) for i in items],
            "now": self._storage.sql_now(),
            "day": utc_day(self._storage.now()),
        }

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        """``complete`` for several tasks in one statement."""
        if not items:
            return []
        params = self._complete_values(items)
        if any(i.follow_ups or i.group for i in items):
            # Continuations: the follow-ups of the leases still held, in the same transaction.
            def follow_ups(rows: list[Row]) -> list[EnqueueParams]:
                held = {(r["queue"], r["id"]) for r in rows}
                out: list[EnqueueParams] = []
                for item in items:
                    key = (item.lease.queue, item.lease.id)
                    if key in held:
                        held.discard(key)
                        out.extend(item.follow_ups)
                return out

            # Group members: their outcomes and fan-in, in the same transaction.
            async def groups(conn: AsyncConn, rows: list[Row]) -> list[EnqueueOutcome]:
                held = {(r["queue"], r["id"]) for r in rows}
                finished = []
                for item in items:
                    key = (item.lease.queue, item.lease.id)
                    if item.group is not None and key in held:
                        held.discard(key)
                        finished.append((*key, item.group))
                if not finished:
                    return []
                return await self._storage.finish_members(conn, finished)

            rows = await self._storage.write_with_follow_ups(
                "complete", "complete", params, follow_ups, groups
            )
        else:
            rows = await self._storage.fetch("complete", "complete", params)
        return self._completed(items, rows)

    def _completed(
        self, items: Sequence[CompleteParams], rows: list[Row], served: Set[str] = frozenset()
    ) -> list[bool]:
        """Wake and announce what the complete statement's ``rows`` ended (this worker's
        claim has looked at the queues in ``served`` since); one answer per item."""
        self._wake((r["queue"] for r in rows if r["wake"]), served)
        # Waiting tasks these completions released (complete's "released", the same on
        # every row).
        if rows and rows[0].get("released"):
            self._wake(rows[0]["released"], served)
        # Ends are announced for the tasks someone waits for (watch_end marked them).
        self._storage.ended((r["queue"], r["id"]) for r in rows if r["watched"])
        done = {(r["queue"], r["id"]) for r in rows}
        answers: list[bool] = []
        for item in items:
            # A lease named twice in one batch finished once: only its first mention is True.
            key = (item.lease.queue, item.lease.id)
            answers.append(key in done)
            done.discard(key)
        return answers

    def _lease_move(self, p: LeaseMove, now: float) -> tuple[str, dict[str, Any]]:
        """The statement and parameters of one fenced retry or archive."""
        values: dict[str, Any] = {
            "queue": p.lease.queue,
            "id": p.lease.id,
            "token": p.lease.token,
            "error": p.error,
            "traceback": p.traceback,
            "lost": int(p.lost),
            "expired_by": p.expired_by,
            "now": self._storage.sql_now(),
            "day": utc_day(now),
        }
        if isinstance(p, RetryParams):
            values["delay"] = max(0.0, float(p.delay))
            values["snooze"] = p.snooze
            values["awaits"] = p.awaits
            values["keep"] = p.keep
            return "retry", values
        values["count_attempt"] = p.count_attempt
        return "archive", values

    async def move_leases(self, moves: Sequence[LeaseMove]) -> list[bool]:
        """Several fenced retry/archive moves, with their follow-ups, in one transaction."""
        if not moves:
            return []
        now = self._storage.now()
        done: list[bool] = []
        woken: set[str] = set()
        created: list[EnqueueOutcome] = []
        async with self._storage.connection("move_leases") as conn, conn.transaction():
            if len(moves) > 1:
                # Each move locks its counters; take them all first, in key order, as claims
                # do, so that a batch and a claim never wait for each other in a cycle.
                await conn.execute(
                    self._storage.statements["move_leases_lock"],
                    {"queues": [p.lease.queue for p in moves], "ids": [p.lease.id for p in moves]},
                )
            for p in moves:
                query, values = self._lease_move(p, now)
                cur = await conn.execute(self._storage.statements[query], values)
                row = await cur.fetchone()
                held = bool(row and row["n"])
                done.append(held)
                if held and row and row["wake"]:
                    woken.add(p.lease.queue)
                if held and row and row.get("released"):
                    woken.update(row["released"])
                if held and isinstance(p, ArchiveParams) and p.follow_ups:
                    created += await self._storage.drive(
                        conn, self._storage.plan(p.follow_ups, None)
                    )
                if held and isinstance(p, ArchiveParams) and p.group is not None:
                    finished = [(p.lease.queue, p.lease.id, p.group)]
                    created += await self._storage.finish_members(conn, finished)
        self._storage.notify_created(created)
        self._storage.ended(ended_by(moves, done))
        self._wake(woken)
        return done

    def _wake(self, queues: Iterable[str], served: Set[str] = frozenset()) -> None:
        """Wake the workers of queues where an ended attempt freed a key tasks wait on, or a
        task became pending (a signal it waited for), this worker's not for ``served``: its
        claim has looked at them since."""
        wanted = set(queues)
        if wanted:
            # This worker's fetcher claims at once; the others hear the NOTIFY.
            if self._listener is not None and wanted - served:
                self._listener.poke(wanted - served)
            self._storage.notifier.add(wanted)

    async def retry(self, params: RetryParams) -> bool:
        """Schedule the next attempt; ``False`` if the lease is no longer held."""
        row = await self._storage.fetch_one("retry", *self._lease_move(params, self._storage.now()))
        return self._moved(row, params.lease.queue)

    def _moved(self, row: Row | None, queue: str) -> bool:
        if row and row["n"] and row["wake"]:
            self._wake([queue])
        if row and row["n"] and row.get("released"):
            self._wake(row["released"])
        return bool(row and row["n"])

    async def archive(self, params: ArchiveParams) -> bool:
        """Give up on the task; ``False`` if the lease is no longer held."""
        if params.follow_ups or params.group is not None:
            (done,) = await self.move_leases([params])
            return done
        row = await self._storage.fetch_one(
            "archive", *self._lease_move(params, self._storage.now())
        )
        if row and row["n"]:
            self._storage.ended([params.lease.task_key])
        return self._moved(row, params.lease.queue)

    async def report_progress(self, params: ProgressParams) -> bool:
        """Store an attempt's progress and log lines, fenced by its token (one statement
        appends and trims the log)."""
        row = await self._storage.fetch_one(
            "report_progress",
            "report_progress",
            {
                "queue": params.lease.queue,
                "id": params.lease.id,
                "token": params.lease.token,
                "progress": params.progress,
                "lines": "\n".join(params.lines) if params.lines else None,
                "keep": MAX_LOG_LINES,
            },
        )
        return row is not None

    async def read_steps(self, lease: LeaseRef) -> str | None:
        """The stored steps of a leased task (``None``: none, or the lease is gone)."""
        fence = {"queue": lease.queue, "id": lease.id, "token": lease.token}
        row = await self._storage.fetch_one("read_steps", "read_steps", fence)
        return None if row is None else row["steps"]

    async def read_signals(self, lease: LeaseRef) -> str | None:
        """The signals stored on a leased task, one JSON object (``None``: none, or the
        lease is gone)."""
        fence = {"queue": lease.queue, "id": lease.id, "token": lease.token}
        row = await self._storage.fetch_one("read_signals", "read_signals", fence)
        return None if row is None else row["signals"]

    async def signal(self, params: SignalParams) -> str:
        """Deliver a signal in one statement: "woken", "kept", "duplicate" or "finished";
        TaskNotFoundError when the task does not exist."""
        row = await self._storage.fetch_one(
            "signal",
            "signal",
            {
                "queue": params.queue,
                "id": params.id,
                "name": params.name,
                "payload": params.payload,
                "now": self._storage.sql_now(),
            },
        )
        if row is None:
            raise TaskNotFoundError(f"no task {params.id!r} in queue {params.queue!r}")
        if row["known"]:  # before "finished": a sender calling again after the end is fine
            return "duplicate"
        if row["state"] in ("completed", "archived"):
            return "finished"
        if row["woken"]:
            # Pending now: its queue's workers claim it (this one's at once, others by NOTIFY).
            self._wake([params.queue])
            return "woken"
        return "kept"

    async def free_unique(self, params: UniqueRelease) -> bool:
        """Free a twin's unique key while it is in one of ``params.states``."""
        values = {
            "queue": params.queue,
            "id": params.id,
            "key": params.key,
            "states": [TaskState(s).value for s in params.states],
        }
        return await self._storage.rowcount("free_unique", "free_unique", values) == 1

    async def replace_twin(self, params: TwinReplace) -> TaskInfo | None:
        """Change a waiting twin in place (see :class:`TwinReplace`)."""
        values = {**twin_params(params), "now": self._storage.sql_now()}
        row = await self._storage.fetch_one("replace_twin", "replace_twin", values)
        return None if row is None else row_to_info(row)

    async def read_snoozes(self, lease: LeaseRef) -> int | None:
        """How often a leased task was snoozed (``None``: the lease is gone)."""
        fence = {"queue": lease.queue, "id": lease.id, "token": lease.token}
        row = await self._storage.fetch_one("read_snoozes", "read_snoozes", fence)
        return None if row is None else int(row["snoozes"])

    async def record_steps(self, params: StepsParams) -> bool:
        """Store an attempt's durable steps, fenced by its token."""
        lease = params.lease
        fence = {"queue": lease.queue, "id": lease.id, "token": lease.token}
        row = await self._storage.fetch_one(
            "record_steps", "record_steps", {**fence, "steps": params.steps}
        )
        return row is not None

    async def record_steps_many(self, items: Sequence[StepsParams]) -> list[bool]:
        """Several attempts' durable steps in one statement, each fenced by its token. A
        lease named twice sends its last steps once (an UPDATE writes a row once), and
        every item of that lease gets their answer."""
        if not items:
            return []
        last = {(p.lease.queue, p.lease.id, p.lease.token): p.steps for p in items}
        rows = await self._storage.fetch(
            "record_steps_many",
            "record_steps_many",
            {
                "task_queues": [queue for queue, _, _ in last],
                "ids": [task_id for _, task_id, _ in last],
                "tokens": [token for _, _, token in last],
                "steps": list(last.values()),
            },
        )
        held = {(r["queue"], r["id"], r["token"]) for r in rows}
        return [(p.lease.queue, p.lease.id, p.lease.token) in held for p in items]

    async def requeue(self, lease: LeaseRef, keep: bool = False) -> bool:
        """Hand an active task back as pending without counting an attempt (W7); ``keep``:
        it keeps its sequences' keys (W25)."""
        row = await self._storage.fetch_one(
            "requeue",
            "requeue",
            {
                "queue": lease.queue,
                "id": lease.id,
                "token": lease.token,
                "keep": keep,
                "now": self._storage.sql_now(),
                "channel": self._storage.channel,
            },
        )
        return bool(row and row["n"])

    # ------------------------------------------------------------------ maintenance

    async def promote_due(self) -> int:
        """Flip due scheduled/retry tasks to pending (claim takes them anyway; this keeps the
        inspector's view current and wakes listeners) and waits for a signal whose time ran
        out (nothing else wakes those); returns how many."""
        total = 0
        while True:
            row = await self._storage.fetch_one(
                "promote_due",
                "promote_due",
                {"now": self._storage.sql_now(), "limit": _BATCH, "channel": self._storage.channel},
            )
            moved = int(row["n"]) if row else 0
            total += moved
            if moved < _BATCH:  # each of the two scans found fewer than a batch
                return total

    async def expired_leases(self, limit: int) -> list[Lease]:
        """Active tasks whose lease expired by now, oldest expiry first."""
        rows = await self._storage.fetch(
            "expired_leases", "expired_leases", {"now": self._storage.sql_now(), "limit": limit}
        )
        return [Lease(row_to_info(r), r["lease_token"]) for r in rows]

    async def delete_archived(self, retention: ArchivedRetention, limit: int) -> int:
        """Delete up to ``limit`` archived tasks past their queue's archived retention."""
        if retention.keeps_all or limit <= 0:
            return 0
        params = {
            "queues": list(retention.queues),
            "keeps": list(retention.queues.values()),
            "default": retention.default,
            "limit": limit,
            "now": self._storage.sql_now(),
        }
        return await self._storage.rowcount("delete_archived", "delete_archived", params)

    async def delete_expired(self, limit: int) -> int:
        """Janitor: delete up to ``limit`` completed tasks whose retention has passed."""
        now = self._storage.sql_now()
        await self._storage.rowcount(
            "delete_expired", "prune_minute_stats", {"now": now, "keep": MINUTE_COUNTS_KEEP}
        )
        if limit <= 0:
            return 0
        params = {"now": now, "limit": limit}
        # Finished groups past their retention go in the same bounded way.
        await self._storage.rowcount("delete_expired", "delete_expired_groups", params)
        deleted = await self._storage.rowcount("delete_expired", "delete_expired", params)
        # Then workflow records none of whose nodes' tasks is left.
        await self._storage.rowcount("delete_expired", "delete_expired_workflows", params)
        return deleted

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait for a NOTIFY on one of ``queues``, or ``timeout`` seconds.

        ``True`` when woken (also after the listening connection (re)connects, since
        notifications may have been lost meanwhile). The caller bounds the wait, which is the
        fallback poll for notifications lost in a server restart."""
        if timeout <= 0:
            return False
        wanted = frozenset(queues)
        if not wanted or self._polling:
            await asyncio.sleep(timeout)
            return False
        return await self._listen().wait(wanted, timeout, self._claim_marks)

    def _start_listening(self) -> None:
        if not self._polling:
            self._listen().start()
        elif not self._polling_warned:
            self._polling_warned = True
            log.warning(
                "PostgreSQL behind PgBouncer without listen_url: no LISTEN wake-ups, "
                "workers poll for new tasks (add listen_url=<direct postgresql:// URL>)"
            )

    def _listen(self) -> Listener:
        # One listening connection per broker instance, opened on first need (workers only),
        # straight to PostgreSQL when listen_url is given.
        if self._listener is None:
            dsn = self._storage.listen_dsn or self._storage.dsn
            self._listener = Listener(dsn, self._storage.channel, self._storage.connect_kwargs())
        return self._listener

    @asynccontextmanager
    async def watch_end(self, queue: str, task_id: str) -> AsyncIterator[EndWatch]:
        """Subscribe to the end of one task: LISTEN on the schema's end channel (one
        connection per broker object, opened on first use; behind PgBouncer without
        ``listen_url`` nothing is heard and the caller's re-check finds the end)."""
        if self._end_listener is None:
            dsn = self._storage.listen_dsn or self._storage.dsn
            self._end_listener = EndListener(
                dsn, self._storage.end_channel, self._storage.connect_kwargs()
            )
        listener = self._end_listener
        if not self._polling:
            await listener.ready(self._storage.connect_timeout)
        async with listener.watches.watching(end_key(queue, task_id)) as watch:
            if not self._polling:
                # Listening first: the completion that reads the mark announces the end.
                await self._storage.fetch(
                    "watch_end", "watch_task", {"queue": queue, "id": task_id}
                )
            yield watch

    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert or refresh a worker's row (its heartbeat); also makes its queues known."""
        await self._storage.sync_clock("register_worker")  # rides the heartbeat, once a minute
        await self._storage.fetch(
            "register_worker",
            "register_worker",
            {
                "id": info.id,
                "host": info.host,
                "pid": info.pid,
                "queues": json.dumps(dict(info.queues)),
                "concurrency": info.concurrency,
                "strict": info.strict,
                "started_at": float(info.started_at),
                "now": self._storage.now(),
                "forget_before": self._storage.now() - FORGET_WORKERS_AFTER,
                "active": info.active,
                "queue_names": list(info.queues),
            },
        )

    async def durability_warnings(self) -> list[str]:
        """None to report: a commit is durable (see docs/guarantees.md)."""
        return []

    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's row at shutdown."""
        await self._storage.fetch("unregister_worker", "unregister_worker", {"id": worker_id})


def _held_answer(rows: list[tuple[Any, ...]]) -> tuple[bool, float | None]:
    """From a claim's answer: whether due tasks carry limits or held tasks have room (the
    claim of limited work is then needed), and when a token comes for a held task."""
    if not rows:
        return False, None
    first = rows[0]
    held = json.loads(first[CLAIM_HELD] or "[]")
    if not held:
        return bool(first[CLAIM_LIMITED]), None
    counters = (
        limiter.Counter(running, concurrency, rate, per, tokens, refilled_at, True, need, *override)
        for _, running, concurrency, rate, per, tokens, refilled_at, need, *override in held
    )
    room, wake_at = limiter.outlook(counters, held[0][0])  # [0][0]: the claim's now
    return bool(first[CLAIM_LIMITED]) or room, wake_at


class _Candidate:
    """A due or held task the claim of limited work locked, in claim order."""

    __slots__ = (
        "admitted",
        "ctid",
        "held_on",
        "id",
        "kept",
        "order",
        "queue",
        "specs",
        "template",
        "turn_order",
    )

    def __init__(self, row: Row, rank: int) -> None:
        self.queue: str = row["queue"]
        self.id: str = row["id"]
        self.ctid: str = row["ctid"]
        self.specs: tuple[LimitSpec, ...] = limits_of(row["limits"])
        self.held_on: str | None = row.get("held_on")
        #: W25: it holds its sequences' keys already (their slots are counted).
        self.kept: bool = bool(row.get("kept"))
        self.order = (rank, -row["priority"], row["next_process_at"], row["seq"])
        template = row.get("fair_template")
        #: W22: its fair template (with its queue) and its place among that template's tasks.
        self.template = None if template is None else (self.queue, template)
        self.turn_order = (-row["priority"], row.get("fair_turn") or 0, row["seq"])
        self.admitted = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.queue, self.id)


class _Admission:
    """One round of the claim of limited work: what its statements read, and the limiter's
    decisions (:func:`durq.brokers.limiter.admit`) in claim order, as the parameters of the
    statements that write them."""

    def __init__(self, queues: list[str], now: float, want: int, limit: int) -> None:
        self.ranks = {q: i for i, q in enumerate(queues)}
        self.now = now
        self.want = want
        self.limit = limit
        self.due = 0
        self.candidates: list[_Candidate] = []
        #: Every key the candidates carry (queue, key), and the first limit seen on each.
        self.specs: dict[tuple[str, str], LimitSpec] = {}
        #: Keys with held tasks that have room, and how many held tasks the claim looks at.
        self.rooms: dict[tuple[str, str], int] = {}
        #: The locked counters, by queue and key.
        self.counters: dict[str, dict[str, limiter.Counter]] = {}
        self.chosen: list[str] = []
        self.holds: list[tuple[str, str]] = []
        self.dirty: set[tuple[str, str]] = set()
        self.settle: list[tuple[str, str]] = []
        self.limited = False
        #: Some candidate needed a counter another transaction held.
        self.skipped = False
        #: W22: the claimable tasks of each fair template in turn order, the rounds the
        #: admitted ones move on (by queue and template), and where each chosen fair task
        #: goes in claim order (the place of the task it was taken for).
        self.turns: dict[tuple[str, str], list[_Candidate]] = {}
        self.rounds: dict[tuple[str, str], int] = {}
        self.places: dict[tuple[str, str], tuple[Any, ...]] = {}

    @property
    def seen(self) -> bool:
        """Whether these queues have limited work: the next claim should be this one."""
        return self.limited or bool(self.rooms)

    def again(self, leased: int) -> bool:
        """Whether to claim once more at once: the look-ahead was full and slots stay free."""
        return self.due >= self.limit and leased < self.want

    def _add(self, row: Row) -> None:
        candidate = _Candidate(row, self.ranks[row["queue"]])
        self.candidates.append(candidate)
        for spec in candidate.specs:
            self.specs.setdefault((candidate.queue, spec.key), spec)
            self.limited = True

    def read(self, due: list[Row], waiting: list[Row]) -> None:
        """The due rows and the (locked) counters of keys with held tasks."""
        self.due = len(due)
        for row in due:
            self._add(row)
        self.locked(waiting)
        for row in waiting:
            counter = self.counters[row["queue"]][row["key"]]
            room = counter.room(self.now)
            if room > 0:
                # As many held tasks as the key has room for at its stored limit (slots and
                # tokens), as the other brokers let back: a task then decides by its own
                # limit, and one of another rate must not be let back past that room.
                self.rooms[row["queue"], row["key"]] = min(self.want, room)

    def locked(self, rows: list[Row]) -> None:
        for row in rows:
            self.counters.setdefault(row["queue"], {})[row["key"]] = limiter.stored(row)

    def held(self, rows: list[Row]) -> None:
        """The held tasks of keys without a full set of running attempts; a key with room
        given fewer than it looked for may have none left (its flag is cleared if so)."""
        got: dict[tuple[str, str], int] = {}
        for row in rows:
            key = (row["queue"], row["held_on"])
            # Else its counter is another's, or full, or its room is taken: left held.
            if got.get(key, 0) < self.rooms.get(key, 0):
                self._add(row)
                got[key] = got.get(key, 0) + 1
        self.settle = sorted(k for k, room in self.rooms.items() if got.get(k, 0) < room)

    def fair(self, rows: list[Row]) -> None:
        """W22: the claimable tasks of the fair templates of these queues, in turn order (a
        claim takes at most its look-ahead of each)."""
        for row in rows:
            c = _Candidate(row, self.ranks[row["queue"]])
            if c.template is not None:
                self.turns.setdefault(c.template, []).append(c)
                for spec in c.specs:
                    self.specs.setdefault((c.queue, spec.key), spec)

    def _turns(self, template: tuple[str, str]) -> list[_Candidate]:
        """A template's line: its tasks read by fair_due and those let back here."""
        mine = {c.key: c for c in self.turns.get(template, ())}
        for c in self.candidates:
            if c.template == template:
                mine.setdefault(c.key, c)
        return sorted(mine.values(), key=lambda c: c.turn_order)

    def missing(self) -> list[tuple[str, str]]:
        """Keys of the candidates without a counter."""
        return [k for k in self.specs if k[1] not in self.counters.get(k[0], {})]

    def decide(self) -> None:
        """Admit or hold each candidate in claim order, up to ``want`` leases."""
        self.candidates.sort(key=lambda c: c.order)
        ordered: Iterable[tuple[_Candidate, _Candidate]] = [(c, c) for c in self.candidates]
        if self.turns:
            # Taken as the loop goes, not listed whole: a claim of one fair task read its
            # 100 candidates' turns, 1.34x the client instructions of a non-fair claim.
            ordered = limiter.in_turns(self.candidates, _key, _template, self._turns)
        heads = {c.key: c for c in self.candidates}
        for n, (c, head) in enumerate(ordered):
            if len(self.chosen) >= self.want:
                break  # left as it is: due, or held where it was
            if c.template is not None and c.key not in heads:
                self.candidates.append(c)  # taken from its template's line (W22)
            if not c.specs:
                self.chosen.append(c.ctid)
                continue
            counters = self.counters.setdefault(c.queue, {})
            if any(spec.key not in counters for spec in c.specs):
                # A counter another claim or outcome holds (skipped, not waited for): this
                # task is neither admitted nor held here. It stays due (or held where it
                # was) for the next claim, this worker's within _SKIPPED_AGAIN (wake_at).
                self.skipped = True
                continue
            full = limiter.admit(c.specs, counters, self.now, c.kept)
            if full is None:
                c.admitted = True
                self.chosen.append(c.ctid)
                self.dirty.update((c.queue, spec.key) for spec in c.specs)
                if c.template is not None:
                    turn = c.turn_order[1]
                    self.rounds[c.template] = max(self.rounds.get(c.template, 0), turn)
                    self.places[c.key] = (*head.order[1:], n)
            else:
                self.dirty.add((c.queue, full))
                if full != c.held_on:
                    self.holds.append((c.ctid, full))

    def not_leased(self, leased: list[tuple[Any, ...]]) -> dict[tuple[str, str], int]:
        """The starts counted for admitted candidates that ``leased`` (claimed rows) lacks,
        by queue and key."""
        got = {(r[CLAIM_QUEUE], r[CLAIM_ID]) for r in leased}
        starts: dict[tuple[str, str], int] = {}
        for c in self.candidates:
            if c.admitted and (c.queue, c.id) not in got:
                for spec in limiter.given_back(c.specs, c.kept):  # W25: kept ones not counted
                    starts[c.queue, spec.key] = starts.get((c.queue, spec.key), 0) + spec.cost
        return starts

    def wake_at(self) -> float | None:
        """When a token comes for a key with held tasks, or, when a candidate's counter was
        held by another transaction, when to claim it again."""
        counters = (c for keys in self.counters.values() for c in keys.values())
        wake = limiter.wake_at(counters, self.now)
        if self.skipped:
            again = self.now + _SKIPPED_AGAIN
            wake = again if wake is None else min(wake, again)
        return wake

    def key_params(self, keys: list[tuple[str, str]]) -> dict[str, Any]:
        """lock_limits' parameters: ``keys`` in key order."""
        keys = sorted(keys)
        return {"queues": [q for q, _ in keys], "keys": [k for _, k in keys]}

    def fresh_params(self, keys: list[tuple[str, str]]) -> dict[str, Any]:
        """create_limits' parameters: the counters of ``keys`` as the limiter makes them."""
        return _counter_columns([(k, limiter.fresh(self.specs[k], self.now)) for k in sorted(keys)])

    def hold_params(self) -> dict[str, Any]:
        return {"ctids": [c for c, _ in self.holds], "keys": [k for _, k in self.holds]}

    def save_params(self) -> dict[str, Any]:
        """save_limits' parameters: the counters the decisions changed."""
        saved = [(k, self.counters[k[0]][k[1]]) for k in sorted(self.dirty)]
        return {
            **_counter_columns(saved),
            "running": [c.running for _, c in saved],
            "waiting": [c.waiting for _, c in saved],
            "need": [c.need for _, c in saved],
        }

    def round_params(self) -> dict[str, Any]:
        """fair_rounds' parameters: the rounds of the templates whose tasks started."""
        keys = sorted(self.rounds)
        return {
            "queues": [q for q, _ in keys],
            "templates": [t for _, t in keys],
            "turns": [self.rounds[k] for k in keys],
        }

    def settle_params(self) -> dict[str, Any]:
        return {"queues": [q for q, _ in self.settle], "keys": [k for _, k in self.settle]}


def _key(c: _Candidate) -> tuple[str, str]:
    return c.key


def _template(c: _Candidate) -> tuple[str, str] | None:
    return c.template


def _counter_columns(counters: list[tuple[tuple[str, str], limiter.Counter]]) -> dict[str, Any]:
    """Counters (by queue and key) as one array per column, the bucket's and the limit's."""
    return {
        "queues": [q for (q, _), _ in counters],
        "keys": [k for (_, k), _ in counters],
        "concurrencies": [c.concurrency for _, c in counters],
        "rates": [c.rate for _, c in counters],
        "pers": [c.per for _, c in counters],
        "tokens": [c.tokens for _, c in counters],
        "refilled": [c.refilled_at for _, c in counters],
    }


def _unwrap(outcome: EnqueueOutcome) -> TaskInfo:
    if outcome.error is not None:
        raise outcome.error
    assert outcome.info is not None
    return outcome.info


__all__ = ["PostgresBroker"]


#: Rounds of the claim of limited work one claim goes through before it answers (each one
#: transaction),
#: and how many due tasks past its free slots the first such round looks at (and the most).
_LIMITED_ROUNDS = 8
#: The queue of the claim that warms a new connection up: a space is in no queue's name.
_WARM_UP_QUEUE = "durq warm-up"
_LOOK_AHEAD = 100
#: W22: how many of a fair template's tasks past the free slots a round reads (and locks):
#: the look-ahead's 100 halved fair claims (each locked row is a write).
_FAIR_LOOK_AHEAD = 16
_LOOK_AHEAD_MAX = 3200
#: How soon a claim comes back for tasks whose counter another transaction held (a claim
#: round or an outcome: a few milliseconds).
_SKIPPED_AGAIN = 0.05
