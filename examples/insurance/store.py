"""The orders table, on SQLite or PostgreSQL, and how an order and its task are saved.

``create`` is the heart of the handler side (save the business record, put the task
in the queue, answer 202):

* **PostgreSQL broker** (``transactional_enqueue``): the order row and the durq task are
  written in *one* transaction on one connection; a rollback leaves neither.
* **SQLite broker, orders in the broker's file** (the default): the same, on one sqlite3
  connection: ``BEGIN IMMEDIATE``, insert the order, enqueue on that connection (E8),
  ``COMMIT``.
* **Any other pairing** (Redis, or orders in another file than the broker's): save, then
  enqueue, with a compensation instead of an outbox: the order is committed first (so the task, which a worker may start within
  milliseconds, always finds it), then the task is enqueued; if the enqueue fails the order
  is deleted again and the client gets 503. A crash between the two leaves a PENDING order
  without a task; the client's retry with the same Idempotency-Key finds the order and
  enqueues its task again (same derived task id, so never twice), which heals it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import durq
from durq.web import Answer

SQL_DIR = Path(__file__).with_name("sql")
_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_T = TypeVar("_T")


def load_queries(dialect: str) -> dict[str, str]:
    """``-- name: x`` blocks of ``sql/<dialect>.sql``."""
    text = (SQL_DIR / f"{dialect}.sql").read_text()
    parts = _BLOCK.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@dataclass(frozen=True)
class Order:
    """An order as the service stores it."""

    id: str
    customer: str
    idempotency_key: str | None
    request_hash: str
    items: list[dict[str, Any]]
    status: str
    task_id: str
    external_ref: str | None
    policy_number: str | None
    attempts: int
    last_error: str | None
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: Any) -> Order:
        data = dict(row)
        items = data["items"]
        data["items"] = json.loads(items) if isinstance(items, str | bytes) else items
        return cls(**data)


@dataclass(frozen=True)
class NewOrder:
    """What the handler has validated and wants to save."""

    id: str
    customer: str
    idempotency_key: str | None
    request_hash: str
    items: list[dict[str, Any]]
    task_id: str


#: The enqueue step: gets the store's connection (or ``None``), returns the contract answer.
Enqueue = Callable[[Any], Awaitable[Answer]]


@dataclass(frozen=True)
class Created:
    """The outcome of :meth:`OrderStore.create`: the answer, and the order it concerns
    (``existing`` when an order with this Idempotency-Key was already saved)."""

    answer: Answer | None
    existing: Order | None = None


class OrderStore(Protocol):
    """What the API and the task need from the orders table."""

    transactional: bool

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def create(self, order: NewOrder, enqueue: Enqueue) -> Created: ...
    async def get_for_customer(self, order_id: str, customer: str) -> Order | None: ...
    async def get(self, order_id: str) -> Order | None: ...
    async def set_external_ref(self, order_id: str, ref: str) -> None: ...
    async def record_attempt(self, order_id: str, attempts: int, error: str | None) -> None: ...
    async def mark_covered(self, order_id: str, policy: str, attempts: int) -> bool: ...
    async def mark_failed(self, order_id: str, error: str, attempts: int) -> bool: ...
    async def count(self) -> int: ...


def _params(order: NewOrder, now: float) -> dict[str, Any]:
    return {
        "id": order.id,
        "customer": order.customer,
        "idempotency_key": order.idempotency_key,
        "request_hash": order.request_hash,
        "items": json.dumps(order.items, separators=(",", ":")),
        "task_id": order.task_id,
        "now": now,
    }


def _key_params(order: NewOrder) -> dict[str, Any]:
    """The parameters of ``find_by_key``: the order saved under this Idempotency-Key."""
    return {"customer": order.customer, "idempotency_key": order.idempotency_key}


class _OrderQueries:
    """The single-statement reads and writes, the same on both databases: each dialect gives
    ``_one`` (a row as an :class:`Order`) and ``_write`` (the rows changed)."""

    async def _one(self, name: str, params: dict[str, Any]) -> Order | None:
        raise NotImplementedError

    async def _write(self, name: str, params: dict[str, Any]) -> int:
        raise NotImplementedError

    async def delete(self, order_id: str) -> None:
        await self._write("delete_order", {"id": order_id})

    async def get_for_customer(self, order_id: str, customer: str) -> Order | None:
        return await self._one("get_for_customer", {"id": order_id, "customer": customer})

    async def get(self, order_id: str) -> Order | None:
        return await self._one("get", {"id": order_id})

    async def set_external_ref(self, order_id: str, ref: str) -> None:
        await self._write(
            "set_external_ref", {"id": order_id, "external_ref": ref, "now": time.time()}
        )

    async def record_attempt(self, order_id: str, attempts: int, error: str | None) -> None:
        params = {"id": order_id, "attempts": attempts, "last_error": error, "now": time.time()}
        await self._write("record_attempt", params)

    async def mark_covered(self, order_id: str, policy: str, attempts: int) -> bool:
        params = {
            "id": order_id,
            "policy_number": policy,
            "attempts": attempts,
            "now": time.time(),
        }
        return await self._write("mark_covered", params) == 1

    async def mark_failed(self, order_id: str, error: str, attempts: int) -> bool:
        params = {"id": order_id, "last_error": error, "attempts": attempts, "now": time.time()}
        return await self._write("mark_failed", params) == 1


async def save_then_enqueue(store: Any, order: NewOrder, enqueue: Enqueue) -> Created:
    """Commit the order, then enqueue its task; delete the order if the enqueue fails."""
    existing: Order | None = await store.insert_or_get(order)
    if existing is not None:
        if existing.request_hash == order.request_hash and existing.status == "PENDING":
            # Make sure its task exists (heals a crash between save and enqueue); the derived
            # task id makes this a no-op (200 already_accepted) in the normal case.
            answer = await enqueue(None)
            if not answer.accepted:
                return Created(answer=answer)
        return Created(answer=None, existing=existing)
    try:
        answer = await enqueue(None)
    except BaseException:
        await store.delete(order.id)
        raise
    if not answer.accepted:
        await store.delete(order.id)  # compensation: no order without its task
    return Created(answer=answer)


# -- SQLite -----------------------------------------------------------------------------------


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///…`` URL (query options dropped)."""
    parts = urlsplit(url)
    return unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)


#: How long a write waits for the database's write lock (in this process and across
#: processes) before the request is answered 503 with Retry-After.
DEFAULT_LOCK_BUDGET = 5.0


def _is_lock_timeout(exc: sqlite3.Error) -> bool:
    """SQLite gave up waiting for another connection's lock (``SQLITE_BUSY``/``LOCKED``)."""
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


class SQLiteOrderStore(_OrderQueries):
    """Orders in a SQLite file.

    SQLite lets one connection write at a time. So that concurrent requests queue instead
    of failing, every write of this process goes through **one writer connection** on its
    own thread, taken in turn (an asyncio lock, FIFO) within ``lock_budget`` seconds; the
    rest of the budget is the connection's busy timeout against other processes (the
    worker, the broker's own connection). An exhausted budget raises
    :class:`durq.BrokerUnavailableError`, which the API answers with 503 and Retry-After.
    Waiting happens on the event loop or on the writer thread, never in the shared thread
    pool (threads blocked there on the lock would starve the lock holder's own commit).
    Reads run on a second connection and thread: in WAL mode they never wait for writers.

    ``transactional``: the file is also the SQLite broker's, so an order and its task are
    written in one transaction (E8)."""

    def __init__(
        self, path: str, *, transactional: bool = False, lock_budget: float = DEFAULT_LOCK_BUDGET
    ) -> None:
        self.path = path
        self.transactional = transactional
        self.lock_budget = lock_budget
        self.q = load_queries("sqlite")
        self._writer = _Connection(path, "orders-writer")
        self._reader = _Connection(path, "orders-reader")
        self._turn: asyncio.Lock | None = None

    @classmethod
    def from_url(cls, url: str, *, transactional: bool = False) -> SQLiteOrderStore:
        return cls(sqlite_path(url), transactional=transactional)

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[_Connection]:
        """This process's turn on the writer connection, within the lock budget; the budget
        left after the wait bounds the wait for other processes' locks."""
        if self._turn is None:
            self._turn = asyncio.Lock()
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.lock_budget):
                await self._turn.acquire()
        except TimeoutError:
            raise _unavailable(f"waited {self.lock_budget:g} s for this process's writes") from None
        try:
            left = max(0.0, self.lock_budget - (time.monotonic() - started))
            writer = self._writer
            writer.budget = left
            yield writer
        finally:
            # Runs after anything already queued on the writer thread (one thread, FIFO).
            self._writer.submit(_rollback_if_open)
            self._turn.release()

    async def _write(self, name: str, params: dict[str, Any]) -> int:
        async with self._writing() as writer:
            return await writer.run(lambda conn: conn.execute(self.q[name], params).rowcount)

    async def _one(self, name: str, params: dict[str, Any]) -> Order | None:
        def one(conn: sqlite3.Connection) -> Order | None:
            row = conn.execute(self.q[name], params).fetchone()
            return Order.from_row(row) if row is not None else None

        return await self._reader.run(one)

    async def open(self) -> None:
        async with self._writing() as writer:
            await writer.run(lambda conn: conn.executescript(self.q["create_schema"]))

    async def close(self) -> None:
        await self._writer.close()
        await self._reader.close()

    async def create(self, order: NewOrder, enqueue: Enqueue) -> Created:
        if not self.transactional:
            return await save_then_enqueue(self, order, enqueue)
        async with self._writing() as writer:
            existing = await writer.run(lambda conn: self._begin_and_insert(conn, order))
            if existing is not None:
                await writer.run(_rollback_if_open)
                return Created(answer=None, existing=existing)
            # E8: the task row is written on this connection, in this transaction (we hold
            # the write lock, so this does not wait): both exist after COMMIT, neither after
            # ROLLBACK (which leaving ``_writing`` does unless we committed).
            answer = await enqueue(writer.conn)
            if answer.status_code == 202:
                await writer.run(lambda conn: conn.execute("COMMIT"))
            return Created(answer=answer)

    def _begin_and_insert(self, conn: sqlite3.Connection, order: NewOrder) -> Order | None:
        """Open the transaction and insert ``order``, or return the order already saved under
        its Idempotency-Key (the write lock serialises two requests with one key)."""
        conn.execute("BEGIN IMMEDIATE")
        return self._find_or_insert(conn, order)

    def _find_or_insert(self, conn: sqlite3.Connection, order: NewOrder) -> Order | None:
        if order.idempotency_key is not None:
            row = conn.execute(self.q["find_by_key"], _key_params(order)).fetchone()
            if row is not None:
                return Order.from_row(row)
        conn.execute(self.q["insert_order"], _params(order, time.time()))
        return None

    async def insert_or_get(self, order: NewOrder) -> Order | None:
        """Insert ``order``, or return the order already saved under its Idempotency-Key."""

        def insert(conn: sqlite3.Connection) -> Order | None:
            # BEGIN IMMEDIATE takes the write lock now: two requests with one
            # Idempotency-Key are serialised, so the lookup cannot race the insert.
            existing = self._begin_and_insert(conn, order)
            conn.execute("COMMIT")
            return existing

        async with self._writing() as writer:
            return await writer.run(insert)

    async def count(self) -> int:
        return await self._reader.run(
            lambda conn: int(conn.execute(self.q["count_orders"]).fetchone()[0])
        )


def _unavailable(why: str) -> durq.BrokerUnavailableError:
    return durq.BrokerUnavailableError(
        f"the orders database is busy ({why}); nothing was saved", operation="orders.write"
    )


def _rollback_if_open(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class _Connection:
    """One sqlite3 connection used only from its own thread (sqlite3 blocks), opened on
    first use; ``budget`` is its busy timeout for the next call."""

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.budget = DEFAULT_LOCK_BUDGET
        self._name = name
        self._conn: sqlite3.Connection | None = None
        self._timeout_ms = -1
        self._executor: ThreadPoolExecutor | None = None

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection (for the E8 enqueue, between two calls of this thread)."""
        assert self._conn is not None, "run() opens the connection first"
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.budget, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _call(self, use: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            if self._conn is None:
                self._conn = self._connect()
            timeout_ms = int(self.budget * 1000)
            if timeout_ms != self._timeout_ms:
                self._conn.execute(f"PRAGMA busy_timeout = {timeout_ms}")
                self._timeout_ms = timeout_ms
            return use(self._conn)
        except sqlite3.Error as exc:
            if _is_lock_timeout(exc):
                raise _unavailable(f"{exc}, waited {self.budget:g} s") from exc
            raise

    def submit(self, use: Callable[[sqlite3.Connection], Any]) -> Future[Any]:
        """Queue ``use`` on this connection's thread (after anything queued before)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        return self._executor.submit(self._call, use)

    async def run(self, use: Callable[[sqlite3.Connection], _T]) -> _T:
        result: _T = await asyncio.wrap_future(self.submit(use))
        return result

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        await asyncio.wrap_future(executor.submit(self._close))
        executor.shutdown(wait=False)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# -- PostgreSQL ---------------------------------------------------------------------------------


class PostgresOrderStore(_OrderQueries):
    """Orders in PostgreSQL; with a PostgreSQL broker the task joins the order's transaction."""

    def __init__(self, dsn: str, schema: str, *, transactional: bool) -> None:
        self.dsn = dsn
        self.schema = schema
        self.transactional = transactional
        self._pool: Any = None
        from psycopg import sql

        raw = load_queries("postgres")
        self.q = {
            name: sql.SQL(text).format(schema=sql.Identifier(schema)) for name, text in raw.items()
        }

    async def open(self) -> None:
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        self._pool = AsyncConnectionPool(
            self.dsn, min_size=1, max_size=10, open=False, kwargs={"row_factory": dict_row}
        )
        await self._pool.open(wait=True, timeout=10)
        async with self._pool.connection() as conn:
            await conn.execute(self.q["create_schema"])

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def create(self, order: NewOrder, enqueue: Enqueue) -> Created:
        if not self.transactional:
            return await save_then_enqueue(self, order, enqueue)
        import psycopg

        async with self._pool.connection() as conn:
            try:
                async with conn.transaction():
                    existing = await self._find_or_insert(conn, order)
                    if existing is not None:
                        return Created(answer=None, existing=existing)
                    # E8: the task row is written on this connection, in this transaction:
                    # both exist after COMMIT, neither after ROLLBACK.
                    answer = await enqueue(conn)
                    if answer.status_code != 202:
                        raise _Rollback(answer)
                    return Created(answer=answer)
            except _Rollback as rollback:
                return Created(answer=rollback.answer)
            except psycopg.errors.UniqueViolation:
                # A concurrent request with the same key committed first: answer from it.
                existing = await self._find(conn, order)
                if existing is None:
                    raise
                return Created(answer=None, existing=existing)

    async def _find(self, conn: Any, order: NewOrder) -> Order | None:
        if order.idempotency_key is None:
            return None
        cur = await conn.execute(self.q["find_by_key"], _key_params(order))
        row = await cur.fetchone()
        return Order.from_row(row) if row is not None else None

    async def _find_or_insert(self, conn: Any, order: NewOrder) -> Order | None:
        """Insert ``order`` in the open transaction, or return the one saved under its key.

        The insert comes first (one round trip when the order is new, the usual case); a
        conflict leaves the transaction usable and the saved order is read then."""
        cur = await conn.execute(self.q["insert_order"], _params(order, time.time()))
        if await cur.fetchone() is not None:
            return None
        existing = await self._find(conn, order)
        if existing is None:
            raise RuntimeError(f"order {order.id} conflicts with an order of another key")
        return existing

    async def insert_or_get(self, order: NewOrder) -> Order | None:
        import psycopg

        async with self._pool.connection() as conn:
            try:
                async with conn.transaction():
                    return await self._find_or_insert(conn, order)
            except psycopg.errors.UniqueViolation:
                existing = await self._find(conn, order)
                if existing is None:
                    raise
                return existing

    async def _one(self, name: str, params: dict[str, Any]) -> Order | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(self.q[name], params)
            row = await cur.fetchone()
            return Order.from_row(row) if row is not None else None

    async def _write(self, name: str, params: dict[str, Any]) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(self.q[name], params)
            return int(cur.rowcount)

    async def count(self) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(self.q["count_orders"])
            row = await cur.fetchone()
            return int(row["count"])


class _Rollback(Exception):
    """Leave the transaction without committing, then answer ``answer``."""

    def __init__(self, answer: Answer) -> None:
        super().__init__("rollback")
        self.answer = answer


def open_store(
    database_url: str,
    schema: str,
    *,
    transactional: bool,
    broker_url: str | None = None,
    lock_budget: float = DEFAULT_LOCK_BUDGET,
) -> OrderStore:
    """The store for ``database_url`` (``sqlite:///…`` or ``postgresql://…``).

    ``transactional``: the broker can join the store's transactions (E8); on SQLite only
    when the orders live in the broker's own file (``broker_url``). ``lock_budget``: how
    long a SQLite write waits for the write lock."""
    scheme = urlsplit(database_url).scheme
    if scheme in ("postgresql", "postgres"):
        return PostgresOrderStore(database_url, schema, transactional=transactional)
    if scheme == "sqlite":
        same_file = (
            broker_url is not None
            and urlsplit(broker_url).scheme == "sqlite"
            and os.path.realpath(sqlite_path(broker_url))
            == os.path.realpath(sqlite_path(database_url))
        )
        return SQLiteOrderStore(
            sqlite_path(database_url),
            transactional=transactional and same_file,
            lock_budget=lock_budget,
        )
    raise ValueError(f"unsupported INSURANCE_DATABASE_URL scheme {scheme!r}")
