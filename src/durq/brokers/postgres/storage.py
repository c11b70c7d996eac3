"""What the broker and the inspector share: configuration, the pool, error mapping, queries."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from durq import ranges
from durq.brokers import dependencies, sqlfiles
from durq.brokers.base import (
    EnqueueOutcome,
    EnqueueParams,
    GroupParams,
    MemberOutcome,
    check_distinct,
    fan_in_payload,
    follow_up_from,
    waiting_follow_up,
)
from durq.brokers.mailbox import end_key
from durq.brokers.params import WorkflowParams
from durq.brokers.postgres.errors import pooler_error, pooler_symptom, translate
from durq.brokers.postgres.rows import EnqueuePlan, Row, enqueue_plan
from durq.brokers.postgres.wakeup import Notifier
from durq.brokers.sqlrows import row_to_info
from durq.clock import SYSTEM_CLOCK, Clock, server_clock_for
from durq.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    SchemaError,
)
from durq.states import TaskState
from durq.task import TaskInfo
from durq.urls import check_port, unsplit

DEFAULT_SCHEMA = "durq"
#: Seconds to wait for a connection (TCP connect, or a free pooled connection) before
#: answering BrokerUnavailableError: bounded, so an unreachable server never hangs a caller.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_POOL_MAX = 10
#: The largest pool a URL may ask for (``pool_min``/``pool_max``): PostgreSQL's own
#: ``max_connections`` defaults to 100, so more is a typo.
MAX_POOL = 1000
#: Seconds a pooled connection may stay unused before the pool closes it (one at a time,
#: down to ``pool_min``): psycopg_pool's default.
DEFAULT_POOL_MAX_IDLE = 600.0
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

AsyncConn = psycopg.AsyncConnection[DictRow]

#: The named statements of ``queries.sql``, with ``{schema}`` still in them.
QUERIES: dict[str, str] = sqlfiles.load_queries(__package__)
#: Every migration, in version order.
MIGRATIONS: tuple[sqlfiles.Migration, ...] = sqlfiles.load_migrations(__package__)


#: ``{now}`` in a statement: the broker's clock, read by the server in the statement itself
#: (one value for the whole statement), unless the ``now`` parameter carries a test's clock.
NOW = sql.SQL("coalesce(%(now)s::float8, extract(epoch FROM statement_timestamp())::float8)")

#: Named blocks of ``queries.sql`` that are parts of other statements, not run alone. A block
#: may contain the blocks named before it.
FRAGMENTS = (
    "enqueue_batch",
    "enqueue_insert",
    "release_limits",
    "given_back",
    "kept_back",
    "count_down_lock",
    "count_down",
    "claimable_due",
    "lease_set",
    "claimed_columns",
    "complete_work",
    "claim_due",
    "claim_lease",
)


def render(text: str, schema: str) -> bytes:
    """A statement as bytes with the schema quoted in (the schema cannot be a parameter; bytes:
    psycopg runs it as is) and ``{now}`` spelled out. ``{release_limits}``,
    ``{claimable_due}`` and the others of :data:`FRAGMENTS` are the blocks of those names,
    each shared by several statements."""
    name = sql.Identifier(schema)
    fragments: dict[str, sql.Composable] = {}
    for fragment in FRAGMENTS:
        fragments[fragment] = sql.SQL(QUERIES[fragment]).format(schema=name, now=NOW, **fragments)
    composed = sql.SQL(text).format(schema=name, now=NOW, **fragments)
    return composed.as_bytes(None)


#: The claims a worker sends on every round trip. ``complete_claim``'s text passes psycopg's
#: 4 KB query cache (5.5 KB), so psycopg would split it again for its named parameters on
#: every call (about 0.1 ms of the worker's CPU): they run as raw queries, their parameters
#: numbered once here.
RAW = ("complete_claim", "claim")

_PARAM = re.compile(rb"%\((\w+)\)[sbt]")


@dataclass(frozen=True, slots=True)
class RawStatement:
    """A named statement with ``$1, $2 ...`` in place of its ``%(name)s`` parameters."""

    text: bytes
    names: tuple[str, ...]

    def params(self, values: dict[str, Any]) -> list[Any]:
        """The values of ``values`` in parameter order."""
        return [values[name] for name in self.names]


def raw_statement(query: bytes) -> RawStatement:
    names: list[str] = []

    def number(match: re.Match[bytes]) -> bytes:
        name = match.group(1).decode()
        if name not in names:
            names.append(name)
        return b"$%d" % (names.index(name) + 1)

    return RawStatement(_PARAM.sub(number, query), tuple(names))


@cache
def render_raw(schema: str) -> dict[str, RawStatement]:
    """:data:`RAW` for one schema (rendered once per schema)."""
    queries = render_all(schema)
    return {name: raw_statement(queries[name]) for name in RAW}


@cache
def render_all(schema: str) -> dict[str, bytes]:
    """Every named statement for one schema (rendered once per schema; treat as read-only)."""
    return {name: render(text, schema) for name, text in QUERIES.items()}


log = logging.getLogger("durq.brokers.postgres")


def channel_for(schema: str, kind: str = "") -> str:
    """The NOTIFY channel of a schema (at most 63 bytes, an identifier's limit): wake-ups of
    workers, or with ``kind="end"`` the ends of tasks (``App.wait``). Schema names have no
    dot, so the two never meet."""
    prefix = f"durq.{kind}." if kind else "durq."
    name = prefix + schema
    if len(name.encode()) <= 63:
        return name
    return prefix + hashlib.sha256(schema.encode()).hexdigest()[:32]


#: Bytes of task keys packed into one end notification (PostgreSQL's limit is 8000).
_END_PAYLOAD = 7000


def pack_ends(keys: list[str]) -> list[str]:
    """Task keys (``"queue id"``) joined by newlines into as few payloads as fit."""
    payloads: list[str] = []
    current: list[str] = []
    size = 0
    for key in keys:
        length = len(key.encode()) + 1
        if current and size + length > _END_PAYLOAD:
            payloads.append("\n".join(current))
            current, size = [], 0
        current.append(key)
        size += length
    if current:
        payloads.append("\n".join(current))
    return payloads


class PostgresStorage:
    """Configuration, the connection pool, the schema and the statements of one broker;
    :class:`~durq.brokers.postgres.broker.PostgresBroker` and
    :class:`~durq.brokers.postgres.admin.PostgresAdmin` both work on one of these."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock = SYSTEM_CLOCK,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_min: int = 1,
        pool_max: int = DEFAULT_POOL_MAX,
        pool_max_idle: float = DEFAULT_POOL_MAX_IDLE,
        pgbouncer: bool | None = None,
        listen_url: str | None = None,
    ) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ConfigurationError(
                f"invalid PostgreSQL schema name {schema!r}: use letters, digits and _"
            )
        self.dsn = dsn
        self._schema = schema
        self._clock: Clock = clock
        #: Set when the real clock is used: times then come from the server (W1).
        self._server_clock = server_clock_for(clock)
        self.connect_timeout = ranges.seconds(
            "connect_timeout", connect_timeout, high=3600, positive=True
        )
        self._pool_min = ranges.integer("pool_min", pool_min, 0, MAX_POOL)
        self._pool_max = max(ranges.integer("pool_max", pool_max, 1, MAX_POOL), pool_min)
        self._pool_max_idle = ranges.seconds("pool_max_idle", pool_max_idle, positive=True)
        #: Behind a transaction-pooling PgBouncer: no named prepared statements, and LISTEN
        #: only on ``listen_url`` (a session of its own straight to PostgreSQL). ``None``
        #: (the URL does not say): found out at connect (:meth:`behind_transaction_pooler`).
        self._pgbouncer = pgbouncer
        #: Called when the check at connect finds a transaction pooler.
        self.pooler_found: Callable[[], None] | None = None
        #: What preparing a new pooled connection met through a pooler (pgbouncer=0): the
        #: pool retries those in the background, and the open names this instead of a timeout.
        self._pooler_symptom: psycopg.Error | None = None
        self.listen_dsn = self.parse_url(listen_url)[0] if listen_url else None
        self._channel = channel_for(schema)
        #: Where the ends of tasks are announced (``App.wait`` listens; workers do not).
        self.end_channel = channel_for(schema, "end")
        self.statements = render_all(schema)
        self.raw_statements = render_raw(schema)
        self.pool: AsyncConnectionPool[AsyncConn] | None = None
        self.notifier = Notifier(self._send_notify)
        self.end_notifier = Notifier(self._send_ends)
        self._open_lock = asyncio.Lock()
        #: Run on each new connection of the pool after ``generic_plans`` once set (the
        #: broker sets it when it first claims; see ``PostgresBroker._warm_up``).
        self.warm_up: Callable[[AsyncConn], Awaitable[None]] | None = None

    @staticmethod
    def parse_url(url: str) -> tuple[str, dict[str, Any]]:
        """Split a broker URL into the libpq DSN and our own options."""
        parts = urlsplit(url)
        scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
        if "," not in parts.netloc:  # a list of hosts is libpq's to read
            check_port(parts)
        query = parse_qsl(parts.query, keep_blank_values=True)
        options: dict[str, Any] = {}
        rest: list[tuple[str, str]] = []
        for key, value in query:
            if key == "schema":
                options["schema"] = value or DEFAULT_SCHEMA
            elif key == "pgbouncer":
                if value.lower() not in _TRUE + _FALSE:
                    raise ConfigurationError(f"pgbouncer must be 1 or 0, not {value!r}")
                options["pgbouncer"] = value.lower() in _TRUE
            elif key == "listen_url":
                if urlsplit(value).scheme not in ("postgres", "postgresql"):
                    raise ConfigurationError(
                        f"listen_url must be a postgresql:// URL, not {value!r}"
                    )
                options["listen_url"] = value
            elif key == "pool_max_idle":
                options[key] = ranges.seconds(key, value, positive=True)
            elif key == "pool_min":
                options[key] = ranges.integer(key, value, 0, MAX_POOL)
            elif key == "pool_max":
                options[key] = ranges.integer(key, value, 1, MAX_POOL)
            else:
                if key == "connect_timeout":  # libpq reads it too: checked here for both
                    options[key] = ranges.seconds(key, value, high=3600, positive=True)
                rest.append((key, value))
        if options.get("pool_min", 0) > options.get("pool_max", MAX_POOL):
            raise ConfigurationError(
                f"pool_min ({options['pool_min']}) must not exceed pool_max ({options['pool_max']})"
            )
        dsn = unsplit(parts._replace(scheme=scheme, query=urlencode(rest)))
        return dsn, options

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with (the server's, once measured)."""
        return self._clock

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds this broker's tables."""
        return self._schema

    @property
    def pgbouncer(self) -> bool:
        """Whether the broker talks to a transaction pooler (said in the URL or found out)."""
        return bool(self._pgbouncer)

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this schema."""
        return self._channel

    def connect_kwargs(self) -> dict[str, Any]:
        # libpq wants whole seconds, at least 2 (it treats 1 as 2).
        kwargs: dict[str, Any] = {"connect_timeout": max(2, round(self.connect_timeout))}
        if self._pgbouncer:
            # A named prepared statement lives in one server session; PgBouncer 1.18 hands
            # each transaction to any session, where it does not exist.
            kwargs["prepare_threshold"] = None
        return kwargs

    def op(self, method: str) -> str:
        return f"postgres.{method}"

    def now(self) -> float:
        """The broker's clock as this process estimates it (the measured offset)."""
        return self._clock.now()

    def plan(
        self, items: Sequence[EnqueueParams], channel: str | None, *, alone: bool = False
    ) -> EnqueuePlan:
        """The enqueue plan of ``items`` on this broker's clock; ``alone``: on a connection
        of the pool in autocommit, no transaction around it (see :func:`enqueue_plan`)."""
        return enqueue_plan(items, self.now(), channel, self.sql_now(), alone=alone)

    def sql_now(self) -> float | None:
        """The ``now`` parameter of a statement: ``None`` lets the server read its own clock
        (``{now}``); an injected test clock is passed as is."""
        return None if self._server_clock is not None else self._clock.now()

    async def sync_clock(self, method: str) -> None:
        """Measure the server clock's offset (at connect, then every minute or so)."""
        server = self._server_clock
        if server is None or not server.due:
            return

        async def read() -> float:
            row = await self.fetch_one(method, "server_time", {})
            return float(row["now"]) if row else server.now()

        await server.sync(read)
        self._clock = server

    # ------------------------------------------------------------------ errors

    @contextlib.asynccontextmanager
    async def errors(self, method: str) -> AsyncIterator[None]:
        """Raise durq errors instead of driver errors for the block."""
        try:
            yield
        except psycopg.Error as exc:
            mapped = translate(exc, self.op(method), self._schema)
            if mapped is None:
                raise
            if isinstance(mapped, BrokerUnavailableError):
                await self._discard_broken()
            raise mapped from exc
        except OSError as exc:
            raise BrokerUnavailableError(
                f"PostgreSQL is unavailable: {exc}", operation=self.op(method)
            ) from exc

    async def _discard_broken(self) -> None:
        # After a server restart every idle pooled connection is dead. The pool drops a bad
        # connection when it comes back, but the idle ones would each fail one more call:
        # test them all now so the next call gets a fresh connection.
        pool = self.pool
        if pool is None or pool.closed:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.connect_timeout):
                await pool.check()

    # ------------------------------------------------------------------ connections

    async def open_pool(self, method: str) -> AsyncConnectionPool[AsyncConn]:
        async with self._open_lock:
            if self.pool is not None:
                return self.pool
            kwargs: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
            if not self._pgbouncer:
                # Every statement is prepared at its first call on a connection: the pool
                # hands its connections out in turn, and psycopg's default (at the fifth
                # call) planned a statement anew five times on each of them; an idle
                # worker's first pickups after a busy spell took 2-3 ms more
                # (pickup_trace.py --percentile 99). Behind PgBouncer nothing is prepared.
                kwargs["prepare_threshold"] = 0
            kwargs.update(self.connect_kwargs())
            pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
                self.dsn,
                kwargs=kwargs,
                min_size=self._pool_min,
                max_size=self._pool_max,
                max_idle=self._pool_max_idle,
                timeout=self.connect_timeout,
                # psycopg_pool's reconnect backoff doubles without a cap: a long attempt
                # would leave us minutes behind a server that is back. Give up early
                # instead; the next call that needs a connection starts a fresh attempt.
                reconnect_timeout=max(10.0, 2 * self.connect_timeout),
                open=False,
                name=f"durq:{self._schema}",
                configure=None if self._pgbouncer else self._configure,
            )
            async with self.errors(method):
                try:
                    await pool.open(wait=True, timeout=self.connect_timeout)
                except BaseException as exc:
                    await pool.close()
                    if self._pooler_symptom is not None and isinstance(exc, Exception):
                        raise pooler_error(self._pooler_symptom, self.op(method)) from exc
                    raise
            self.pool = pool
            return pool

    async def _configure(self, conn: AsyncConn) -> None:
        # A session setting: behind PgBouncer (transaction pooling) it would reach other
        # clients' sessions, so it is not used there (see the `generic_plans` query).
        try:
            await conn.execute(self.statements["generic_plans"])
        except psycopg.Error as exc:
            if pooler_symptom(exc):
                self._pooler_symptom = exc
            raise
        if self.warm_up is not None:
            await self.warm_up(conn)

    @contextlib.asynccontextmanager
    async def connection(self, method: str) -> AsyncIterator[AsyncConn]:
        """A pooled autocommit connection; driver errors become durq errors."""
        pool = self.pool or await self.ensure_connected(method)
        async with self.errors(method), pool.connection() as conn:
            yield conn

    async def drive(self, conn: psycopg.AsyncConnection[Any], plan: EnqueuePlan) -> Any:
        # Runs the sans-IO plan's statements on one connection (ours or the caller's).
        async with conn.cursor(row_factory=dict_row) as cur:
            try:
                name, params = next(plan)
                while True:
                    rows: list[Row] | None
                    try:
                        await cur.execute(self.statements[name], params)
                        rows = await cur.fetchall() if cur.description else []
                    except psycopg.errors.UniqueViolation:
                        if name != "enqueue_fresh":
                            raise
                        rows = None  # a conflict: the plan sends the batch again with care
                    name, params = plan.send(rows)
            except StopIteration as stop:
                return stop.value

    def notify_created(self, outcomes: list[EnqueueOutcome]) -> None:
        """Wake listeners of the queues that got pending tasks; call after the commit. The
        notifier sends it in the background (see ``notifier.py``)."""
        queues = {o.info.queue for o in outcomes if o.info and o.info.state is TaskState.PENDING}
        if queues:
            self.notifier.add(queues)

    async def _send_notify(self, queues: list[str]) -> None:
        async with self.connection("notify") as conn:
            await conn.execute(
                self.statements["notify"], {"channel": self._channel, "queues": queues}
            )

    def ended(self, tasks: Iterable[tuple[str, str]]) -> None:
        """Announce that ``(queue, id)`` ended; call after the commit. Sent in the background
        and coalesced like the wake-ups, many tasks to a notification."""
        keys = [end_key(queue, task_id) for queue, task_id in tasks]
        if keys:
            self.end_notifier.add(keys)

    async def _send_ends(self, keys: list[str]) -> None:
        async with self.connection("notify") as conn:
            await conn.execute(
                self.statements["notify"], {"channel": self.end_channel, "queues": pack_ends(keys)}
            )

    async def write_with_follow_ups(
        self,
        method: str,
        query: str,
        params: dict[str, Any],
        follow_ups: Callable[[list[Row]], Sequence[EnqueueParams]],
        after: Callable[[AsyncConn, list[Row]], Awaitable[list[EnqueueOutcome]]] | None = None,
    ) -> list[Row]:
        """Run one named statement and create the follow-ups its rows call for, in one
        transaction; notify after the commit. Follow-ups whose id exists are
        skipped (the enqueue plan reports them as conflicts; nothing is raised).
        ``after``: more writes of the same transaction (group outcomes), which may create
        tasks too."""
        async with self.connection(method) as conn:
            async with conn.transaction():
                cur = await conn.execute(self.statements[query], params)
                rows: list[Row] = await cur.fetchall() if cur.description else []
                extra = follow_ups(rows)
                created: list[EnqueueOutcome] = []
                if extra:
                    created = await self.drive(conn, self.plan(extra, None))
                if after is not None:
                    created += await after(conn, rows)
        self.notify_created(created)
        return rows

    # ------------------------------------------------------------------ dependencies

    async def insert_after(self, conn: AsyncConn, p: EnqueueParams) -> EnqueueOutcome:
        """Create a task that waits for ``p.after`` in one transaction (a savepoint in the
        caller's): its unfinished dependencies list it, then it is inserted, waiting for as
        many; a refused task undoes the listing."""
        if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            # A caller's connection between transactions: start its transaction, so that
            # the block below is a savepoint in it, not a transaction committed here (E8).
            await conn.execute(self.statements["ping"])
        try:
            async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(
                    self.statements["hold_dependents"],
                    {
                        "queues": [q for q, _ in p.after],
                        "ids": [i for _, i in p.after],
                        "dependent": json.dumps([[p.queue, p.id]]),
                    },
                )
                held = len(await cur.fetchall())
                created: list[EnqueueOutcome] = await self.drive(conn, self.plan([p], None))
                (outcome,) = created
                if outcome.error is not None:
                    raise _Refused(outcome)
                if held:
                    await cur.execute(
                        self.statements["set_waiting"], {"queue": p.queue, "id": p.id, "n": held}
                    )
                    row = await cur.fetchone()
                    assert row is not None
                    outcome = EnqueueOutcome(p, info=row_to_info(row))
        except _Refused as refused:
            return refused.outcome
        return outcome

    async def release_dependents(self, conn: AsyncConn, lists: Sequence[Any]) -> set[str]:
        """Tasks with these ``dependents`` finished (or were deleted unfinished), in the
        caller's transaction: count each dependent down; the queues of released tasks."""
        lists = [x for x in lists if x]
        if not lists:
            return set()
        values = {"lists": json.dumps(lists), "now": self.sql_now()}
        cur = await conn.execute(self.statements["release_dependents"], values)
        return {r["queue"] for r in await cur.fetchall()}

    # ------------------------------------------------------------------ groups

    async def insert_graph(
        self,
        conn: AsyncConn,
        items: Sequence[EnqueueParams],
        workflow: WorkflowParams | None = None,
    ) -> list[TaskInfo]:
        """Create every task of a graph in the caller's transaction, each waiting for its
        earlier items (one multi-row insert, then one update of the edges), and the
        workflow's record; the first refused task raises (the transaction rolls everything
        back)."""
        edges = dependencies.graph_edges(items)
        check_distinct(items, self.now())
        plain = [replace(p, after=()) for p in items]
        outcomes: list[EnqueueOutcome] = await self.drive(conn, self.plan(plain, None))
        for outcome in outcomes:
            if outcome.error is not None:
                raise outcome.error
        dependents: dict[int, list[list[str]]] = {}
        for i, e in enumerate(edges):
            for j in e:
                dependents.setdefault(j, []).append([items[i].queue, items[i].id])
        touched = [i for i, e in enumerate(edges) if e or i in dependents]
        if touched:
            await conn.execute(
                self.statements["set_graph"],
                {
                    "queues": [items[i].queue for i in touched],
                    "ids": [items[i].id for i in touched],
                    "ns": [len(edges[i]) for i in touched],
                    "lists": [
                        json.dumps(dependents[i]) if i in dependents else None for i in touched
                    ],
                },
            )
        if workflow is not None:
            await self.insert_workflow(conn, workflow)
        infos = [o.info for o in outcomes if o.info is not None]
        return [
            info.replace(state=TaskState.WAITING) if e else info
            for info, e in zip(infos, edges, strict=True)
        ]

    async def insert_workflow(self, conn: AsyncConn, p: WorkflowParams) -> None:
        """A workflow's record and its nodes (one insert each), in the caller's
        transaction."""
        head = {"id": p.id, "name": p.name, "retention": p.retention, "now": self.sql_now()}
        await conn.execute(self.statements["insert_workflow"], head)
        await conn.execute(self.statements["forget_workflow_nodes"], {"id": p.id})
        rows = sqlfiles.workflow_node_rows(p)
        columns = {
            "names": "name",
            "queues": "queue",
            "task_ids": "task_id",
            "types": "type",
            "on_failures": "on_failure",
            "afters": "after",
        }
        await conn.execute(
            self.statements["insert_workflow_nodes"],
            {"workflow_id": p.id, **{k: [r[c] for r in rows] for k, c in columns.items()}},
        )

    async def insert_group(self, conn: AsyncConn, p: GroupParams) -> list[TaskInfo]:
        """Create a group's record, its members and its follow-up (waiting for the group) in
        the caller's transaction; the first refused task raises (the transaction rolls
        everything back)."""
        then = waiting_follow_up(p)
        everything = [*p.members, *([then] if then else [])]
        outcomes: list[EnqueueOutcome] = await self.drive(conn, self.plan(everything, None))
        for outcome in outcomes:
            if outcome.error is not None:
                raise outcome.error
        if then is not None:
            # Waits for one thing, its group: the group's own count releases it.
            outcomes.pop()
            await conn.execute(
                self.statements["set_waiting"], {"queue": then.queue, "id": then.id, "n": 1}
            )
        await conn.execute(self.statements["insert_group"], sqlfiles.group_row(p, self.sql_now()))
        await conn.execute(
            self.statements["insert_group_members"],
            {
                "group_queue": p.queue,
                "group_id": p.id,
                "queues": [m.queue for m in p.members],
                "ids": [m.id for m in p.members],
                "types": [m.type for m in p.members],
                "entries": list(p.unfinished),
            },
        )
        return [o.info for o in outcomes if o.info is not None]

    async def finish_members(
        self, conn: AsyncConn, finished: Sequence[tuple[str, str, MemberOutcome]]
    ) -> list[EnqueueOutcome]:
        """Record members' outcomes (``(queue, task id, outcome)``) and count them."""
        rows: list[Row] = []
        # One lock order (group, then task) for every transaction: no deadlock between two
        # batches that finish members of the same groups.
        for queue, task_id, o in sorted(finished, key=lambda f: (f[2].group_queue, f[2].group)):
            cur = await conn.execute(
                self.statements["finish_member"],
                {
                    "group_queue": o.group_queue,
                    "group_id": o.group,
                    "queue": queue,
                    "id": task_id,
                    "state": o.state,
                    "entry": o.entry,
                },
            )
            rows += await cur.fetchall()
        return await self.count_finished(conn, rows)

    async def forget(
        self, conn: AsyncConn, queue: str, task_id: str | None, state: str
    ) -> list[EnqueueOutcome]:
        """Before the inspector deletes a task (``task_id``) or every task of ``state``: the
        unfinished group members among them finish as deleted."""
        if task_id is not None:
            cur = await conn.execute(
                self.statements["forget_member"], {"queue": queue, "id": task_id}
            )
        else:
            cur = await conn.execute(
                self.statements["forget_members_in_state"], {"queue": queue, "state": state}
            )
        return await self.count_finished(conn, await cur.fetchall())

    async def count_finished(self, conn: AsyncConn, rows: list[Row]) -> list[EnqueueOutcome]:
        """Count newly finished members (one row per member: its group) and release the
        follow-up of each group whose last member this was (create it, for a group
        recorded before follow-ups waited)."""
        created: list[EnqueueOutcome] = []
        counts = Counter((r["group_queue"], r["group_id"]) for r in rows)
        for (group_queue, group_id), n in sorted(counts.items()):
            key = {"group_queue": group_queue, "group_id": group_id}
            cur = await conn.execute(
                self.statements["count_finished"], {**key, "n": n, "now": self.sql_now()}
            )
            g = await cur.fetchone()
            if g is None or g["finished"] < g["total"] or g["then_task"] is None:
                continue
            cur = await conn.execute(self.statements["group_entries"], key)
            entries = [bytes(r["entry"]) for r in await cur.fetchall()]
            payload = fan_in_payload(bytes(g["then_head"]), entries, bytes(g["then_tail"]))
            follow_up = follow_up_from(g["then_task"], payload)
            if not g["then_waiting"]:  # a group created before its follow-up waited
                created += await self.drive(conn, self.plan([follow_up], None))
                continue
            cur = await conn.execute(
                self.statements["release_follow_up"],
                {
                    "queue": follow_up.queue,
                    "id": follow_up.id,
                    "payload": payload,
                    "now": self.sql_now(),
                },
            )
            created += [
                EnqueueOutcome(follow_up, info=row_to_info(r)) for r in await cur.fetchall()
            ]
        return created

    async def fetch(self, method: str, query: str, params: dict[str, Any]) -> list[Row]:
        """Run one named query on a pooled connection; its rows (empty if none)."""
        async with self.connection(method) as conn:
            cur = await conn.execute(self.statements[query], params)
            return await cur.fetchall() if cur.description else []

    async def fetch_one(self, method: str, query: str, params: dict[str, Any]) -> Row | None:
        rows = await self.fetch(method, query, params)
        return rows[0] if rows else None

    async def rowcount(self, method: str, query: str, params: dict[str, Any]) -> int:
        """Run one named statement; how many rows it changed."""
        async with self.connection(method) as conn:
            cur = await conn.execute(self.statements[query], params)
            return max(cur.rowcount, 0)

    # ------------------------------------------------------------------ lifecycle

    async def direct_connection(self, method: str) -> AsyncConn:
        # One plain connection with a hard deadline: its error names the real cause (refused,
        # unknown database, bad password), which a pool's timeout would hide.
        try:
            async with asyncio.timeout(self.connect_timeout + 1):
                return await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, row_factory=dict_row, **self.connect_kwargs()
                )
        except TimeoutError as exc:
            raise BrokerUnavailableError(
                f"PostgreSQL did not answer within {self.connect_timeout:g}s",
                operation=self.op(method),
            ) from exc

    async def behind_transaction_pooler(self, conn: AsyncConn, method: str) -> bool:
        """Whether ``conn`` goes through a transaction pooler (PgBouncer's
        ``pool_mode = transaction``), where a client connection does not keep one server
        session, so prepared statements and session settings land in other clients' sessions.

        Straight to PostgreSQL (or through a session pooler) two open connections never
        share a server process, and a connection keeps its own: a second connection that
        gets ``conn``'s server process, or ``conn`` moving to another while the second holds
        a transaction open, can only be a transaction pooler (a pooler hands the session just
        released to the next client, so one of the two shows). Two round trips on ``conn``,
        one short connection."""

        async def pid(c: AsyncConn) -> int:
            cur = await c.execute(self.statements["backend_pid"], prepare=False)
            row = await cur.fetchone()
            return int(row["pid"]) if row else 0

        first = await pid(conn)
        other = await self.direct_connection(method)
        async with other, other.transaction():
            return await pid(other) == first or await pid(conn) != first

    async def check_schema(self, conn: AsyncConn, method: str) -> None:
        latest = MIGRATIONS[-1].version
        table = sql.Identifier(self._schema, "schema_migrations").as_string(None)
        cur = await conn.execute(self.statements["schema_version"], {"table": table})
        row = await cur.fetchone()
        if row is None or not row["present"]:
            raise SchemaError(
                f"schema {self._schema!r} has no durq tables: run `durq migrate`",
                operation=self.op(method),
            )
        cur = await conn.execute(self.statements["current_version"])
        row = await cur.fetchone()
        version = int(row["version"]) if row else 0
        if version > latest:
            raise SchemaError(
                f"schema {self._schema!r} is at version {version}, newer than this durq "
                f"(version {latest}): upgrade durq",
                operation=self.op(method),
            )
        if version < latest:
            raise SchemaError(
                f"schema {self._schema!r} is at version {version}, this durq needs {latest}: "
                "run `durq migrate`",
                operation=self.op(method),
            )

    async def connect(self) -> None:
        """Open the pool (idempotent). Raises BrokerUnavailableError or SchemaError."""
        await self.ensure_connected("connect")

    async def ensure_connected(self, method: str) -> AsyncConnectionPool[AsyncConn]:
        if self.pool is not None:
            return self.pool
        async with self.errors(method):
            conn = await self.direct_connection(method)
            async with conn:
                await self.check_schema(conn, method)
                if self._pgbouncer is None:
                    self._pgbouncer = await self.behind_transaction_pooler(conn, method)
                    if self._pgbouncer and self.pooler_found is not None:
                        self.pooler_found()
                    if self._pgbouncer:
                        log.warning(
                            "PostgreSQL is reached through a transaction-pooling proxy "
                            "(PgBouncer pool_mode=transaction): prepared statements are off; "
                            "add pgbouncer=1 to the broker URL to say so and skip this check"
                        )
        pool = await self.open_pool(method)
        await self.sync_clock(method)
        return pool

    async def migrate(self) -> list[str]:
        """Apply the missing migrations under an advisory lock; returns their names.

        Safe when several processes run it at once: the lock serialises them and the second
        finds nothing left to do. A schema newer than this code is refused (SchemaError)."""
        applied_now: list[str] = []
        async with self.errors("migrate"):
            conn = await self.direct_connection("migrate")
            async with conn, conn.transaction():
                await conn.execute(
                    self.statements["migrate_lock"], {"key": f"durq.migrate:{self._schema}"}
                )
                await conn.execute(self.statements["create_schema"])
                await conn.execute(self.statements["create_migrations_table"])
                cur = await conn.execute(self.statements["applied_migrations"])
                applied = {int(r["version"]) for r in await cur.fetchall()}
                self._refuse_newer(applied)
                for migration in MIGRATIONS:
                    if migration.version in applied:
                        continue
                    await conn.execute(render(migration.sql, self._schema))
                    label = migration.label
                    await conn.execute(
                        self.statements["record_migration"],
                        {"version": migration.version, "name": label},
                    )
                    applied_now.append(label)
        return applied_now

    async def pending_migrations(self) -> list[str]:
        """The labels of the migrations :meth:`migrate` would apply (all of them when the
        schema has no durq tables); reads only. SchemaError for a newer schema."""
        table = sql.Identifier(self._schema, "schema_migrations").as_string(None)
        async with self.errors("migrate"):
            conn = await self.direct_connection("migrate")
            async with conn:
                cur = await conn.execute(self.statements["schema_version"], {"table": table})
                row = await cur.fetchone()
                applied: set[int] = set()
                if row is not None and row["present"]:
                    cur = await conn.execute(self.statements["applied_migrations"])
                    applied = {int(r["version"]) for r in await cur.fetchall()}
        self._refuse_newer(applied)
        return [m.label for m in MIGRATIONS if m.version not in applied]

    def _refuse_newer(self, applied: set[int]) -> None:
        """SchemaError when ``applied`` holds a version this durq does not know."""
        latest = MIGRATIONS[-1].version
        if applied and max(applied) > latest:
            raise SchemaError(
                f"schema {self._schema!r} is at version {max(applied)}, newer than this "
                f"durq (version {latest}): upgrade durq",
                operation="postgres.migrate",
            )

    async def ping(self) -> None:
        """One cheap round trip; raises BrokerUnavailableError."""
        await self.fetch("ping", "ping", {})

    def drive_sync(self, conn: psycopg.Connection[Any], plan: EnqueuePlan) -> Any:
        with conn.cursor(row_factory=dict_row) as cur:
            try:
                name, params = next(plan)
                while True:
                    cur.execute(self.statements[name], params)
                    rows: list[Row] = cur.fetchall() if cur.description else []
                    name, params = plan.send(rows)
            except StopIteration as stop:
                return stop.value

    @contextlib.contextmanager
    def errors_sync(self, method: str) -> Iterator[None]:
        try:
            yield
        except (psycopg.Error, OSError) as exc:
            mapped = translate(exc, self.op(method), self._schema)
            if mapped is None:
                raise
            raise mapped from exc

    async def close(self) -> None:
        """Send the wake-ups of committed enqueues, then close the pool (idempotent)."""
        await self.notifier.flush()
        await self.end_notifier.flush()
        pool, self.pool = self.pool, None
        if pool is not None:
            await pool.close()


class _Refused(Exception):
    """A task with dependencies was refused: its transaction rolls back (internal)."""

    def __init__(self, outcome: EnqueueOutcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome
