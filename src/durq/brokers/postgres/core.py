"""What the broker and the inspector share: configuration, the pool, error mapping, queries."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from durq.brokers.base import EnqueueOutcome, EnqueueParams
from durq.brokers.postgres import sql as queries
from durq.brokers.postgres.notifier import Notifier
from durq.brokers.postgres.rows import EnqueuePlan, Row, enqueue_plan
from durq.clock import SYSTEM_CLOCK, Clock, server_clock_for
from durq.errors import (
    BrokerError,
    BrokerUnavailableError,
    ConfigurationError,
    InvalidNameError,
    SchemaError,
)
from durq.states import TaskState

DEFAULT_SCHEMA = "durq"
#: Seconds to wait for a connection (TCP connect, or a free pooled connection) before
#: answering BrokerUnavailableError: bounded, so an unreachable server never hangs a caller.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_POOL_MAX = 10
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# Query parameters of the URL that are ours; the rest goes to libpq untouched.
_OWN_PARAMS = ("schema", "pool_min", "pool_max", "pgbouncer", "listen_url")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

AsyncConn = psycopg.AsyncConnection[DictRow]
log = logging.getLogger("durq.brokers.postgres")


def channel_for(schema: str) -> str:
    """The NOTIFY channel of a schema (at most 63 bytes, an identifier's limit)."""
    name = f"durq.{schema}"
    if len(name.encode()) <= 63:
        return name
    return "durq." + hashlib.sha256(schema.encode()).hexdigest()[:32]


def utc_day(ts: float) -> date:
    """The UTC day of an epoch time: the key of the inspector's daily counters."""
    return datetime.fromtimestamp(ts, tz=UTC).date()


class PostgresBase:
    """Configuration, the connection pool and the error mapping of one broker instance."""

    name = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock = SYSTEM_CLOCK,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_min: int = 1,
        pool_max: int = DEFAULT_POOL_MAX,
        pgbouncer: bool = False,
        listen_url: str | None = None,
    ) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ConfigurationError(
                f"invalid PostgreSQL schema name {schema!r}: use letters, digits and _"
            )
        self._dsn = dsn
        self._schema = schema
        self._clock: Clock = clock
        #: Set when the real clock is used: times then come from the server (W1).
        self._server_clock = server_clock_for(clock)
        self._connect_timeout = connect_timeout
        self._pool_min = pool_min
        self._pool_max = max(pool_max, pool_min, 1)
        #: Behind a transaction-pooling PgBouncer: no named prepared statements, and LISTEN
        #: only on ``listen_url`` (a session of its own straight to PostgreSQL).
        self._pgbouncer = pgbouncer
        self._listen_dsn = self.parse_url(listen_url)[0] if listen_url else None
        self._channel = channel_for(schema)
        self._q = queries.render_all(schema)
        self._pool: AsyncConnectionPool[AsyncConn] | None = None
        self._notifier = Notifier(self._send_notify)
        self._open_lock = asyncio.Lock()

    @staticmethod
    def parse_url(url: str) -> tuple[str, dict[str, Any]]:
        """Split a broker URL into the libpq DSN and our own options."""
        parts = urlsplit(url)
        scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
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
            elif key in ("pool_min", "pool_max"):
                try:
                    options[key] = int(value)
                except ValueError as exc:
                    raise ConfigurationError(f"{key} must be an integer, not {value!r}") from exc
            else:
                if key == "connect_timeout":
                    try:
                        options["connect_timeout"] = float(value)
                    except ValueError as exc:
                        raise ConfigurationError(f"invalid connect_timeout {value!r}") from exc
                rest.append((key, value))
        dsn = urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
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
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this schema."""
        return self._channel

    def _connect_kwargs(self) -> dict[str, Any]:
        # libpq wants whole seconds, at least 2 (it treats 1 as 2).
        kwargs: dict[str, Any] = {"connect_timeout": max(2, round(self._connect_timeout))}
        if self._pgbouncer:
            # A named prepared statement lives in one server session; PgBouncer 1.18 hands
            # each transaction to any session, where it does not exist.
            kwargs["prepare_threshold"] = None
        return kwargs

    def _op(self, method: str) -> str:
        return f"postgres.{method}"

    def _now(self) -> float:
        return self._clock.now()

    async def _sync_clock(self, method: str) -> None:
        """Measure the server clock's offset (at connect, then every minute or so)."""
        server = self._server_clock
        if server is None or not server.due:
            return

        async def read() -> float:
            row = await self._fetch_one(method, "server_time", {})
            return float(row["now"]) if row else server.now()

        await server.sync(read)
        self._clock = server

    # ------------------------------------------------------------------ errors

    def _translate(self, method: str, exc: BaseException) -> Exception | None:
        """The durq error for a driver error, or ``None`` when it is not ours to map."""
        op = self._op(method)
        if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
            return SchemaError(
                f"the durq tables are missing in schema {self._schema!r}: run `durq migrate` "
                f"({exc})",
                operation=op,
            )
        if isinstance(exc, psycopg.errors.CheckViolation | psycopg.DataError):
            # The schema's CHECKs (names, ids) or a value PostgreSQL cannot store (NUL in
            # text): a caller that skipped durq.names, refused like at the edge.
            detail = getattr(exc.diag, "constraint_name", None) or str(exc).splitlines()[0]
            return InvalidNameError(f"PostgreSQL refused {op}: {detail}", operation=op)
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return BrokerError(f"PostgreSQL refused {op}: permission denied ({exc})", operation=op)
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError):
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return BrokerUnavailableError(f"PostgreSQL is unavailable: {detail}", operation=op)
        return None

    @contextlib.asynccontextmanager
    async def _errors(self, method: str) -> AsyncIterator[None]:
        """Raise durq errors instead of driver errors for the block."""
        try:
            yield
        except psycopg.Error as exc:
            mapped = self._translate(method, exc)
            if mapped is None:
                raise
            if isinstance(mapped, BrokerUnavailableError):
                await self._discard_broken()
            raise mapped from exc
        except OSError as exc:
            raise BrokerUnavailableError(
                f"PostgreSQL is unavailable: {exc}", operation=self._op(method)
            ) from exc

    async def _discard_broken(self) -> None:
        # After a server restart every idle pooled connection is dead. The pool drops a bad
        # connection when it comes back, but the idle ones would each fail one more call:
        # test them all now so the next call gets a fresh connection.
        pool = self._pool
        if pool is None or pool.closed:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._connect_timeout):
                await pool.check()

    # ------------------------------------------------------------------ connections

    async def _open_pool(self, method: str) -> AsyncConnectionPool[AsyncConn]:
        async with self._open_lock:
            if self._pool is not None:
                return self._pool
            kwargs: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
            kwargs.update(self._connect_kwargs())
            pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
                self._dsn,
                kwargs=kwargs,
                min_size=self._pool_min,
                max_size=self._pool_max,
                timeout=self._connect_timeout,
                # psycopg_pool's reconnect backoff doubles without a cap: a long attempt
                # would leave us minutes behind a server that is back. Give up early
                # instead; the next call that needs a connection starts a fresh attempt.
                reconnect_timeout=max(10.0, 2 * self._connect_timeout),
                open=False,
                name=f"durq:{self._schema}",
            )
            async with self._errors(method):
                try:
                    await pool.open(wait=True, timeout=self._connect_timeout)
                except BaseException:
                    await pool.close()
                    raise
            self._pool = pool
            return pool

    @contextlib.asynccontextmanager
    async def _connection(self, method: str) -> AsyncIterator[AsyncConn]:
        """A pooled autocommit connection; driver errors become durq errors."""
        pool = self._pool or await self._ensure_connected(method)
        async with self._errors(method), pool.connection() as conn:
            yield conn

    async def _ensure_connected(self, method: str) -> AsyncConnectionPool[AsyncConn]:
        raise NotImplementedError  # provided by the broker

    async def _drive(self, conn: psycopg.AsyncConnection[Any], plan: EnqueuePlan) -> Any:
        # Runs the sans-IO plan's statements on one connection (ours or the caller's).
        async with conn.cursor(row_factory=dict_row) as cur:
            try:
                name, params = next(plan)
                while True:
                    await cur.execute(self._q[name], params)
                    rows: list[Row] = await cur.fetchall() if cur.description else []
                    name, params = plan.send(rows)
            except StopIteration as stop:
                return stop.value

    def _notify_created(self, outcomes: list[EnqueueOutcome]) -> None:
        """Wake listeners of the queues that got pending tasks; call after the commit. The
        notifier sends it in the background (see ``notifier.py``)."""
        queues = {o.info.queue for o in outcomes if o.info and o.info.state is TaskState.PENDING}
        if queues:
            self._notifier.add(queues)

    async def _send_notify(self, queues: list[str]) -> None:
        async with self._connection("notify") as conn:
            await conn.execute(self._q["notify"], {"channel": self._channel, "queues": queues})

    async def _write_with_follow_ups(
        self,
        method: str,
        query: str,
        params: dict[str, Any],
        follow_ups: Callable[[list[Row]], Sequence[EnqueueParams]],
    ) -> list[Row]:
        """Run one named statement and create the follow-ups its rows call for, in one
        transaction (continuations); notify after the commit. Follow-ups whose id exists are
        skipped (the enqueue plan reports them as conflicts; nothing is raised)."""
        async with self._connection(method) as conn:
            async with conn.transaction():
                cur = await conn.execute(self._q[query], params)
                rows: list[Row] = await cur.fetchall() if cur.description else []
                extra = follow_ups(rows)
                created: list[EnqueueOutcome] = []
                if extra:
                    created = await self._drive(conn, enqueue_plan(extra, self._now(), None))
        self._notify_created(created)
        return rows

    async def _fetch(self, method: str, query: str, params: dict[str, Any]) -> list[Row]:
        """Run one named query on a pooled connection; its rows (empty if none)."""
        async with self._connection(method) as conn:
            cur = await conn.execute(self._q[query], params)
            return await cur.fetchall() if cur.description else []

    async def _fetch_one(self, method: str, query: str, params: dict[str, Any]) -> Row | None:
        rows = await self._fetch(method, query, params)
        return rows[0] if rows else None

    async def _rowcount(self, method: str, query: str, params: dict[str, Any]) -> int:
        """Run one named statement; how many rows it changed."""
        async with self._connection(method) as conn:
            cur = await conn.execute(self._q[query], params)
            return max(cur.rowcount, 0)
