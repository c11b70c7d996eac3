"""The orders table, on SQLite or PostgreSQL, and how an order and its task are saved.

``create`` is the heart of the handler side (save the business record, put the task
in the queue, answer 202). Concurrent requests share the work: while one transaction is in
flight, the orders that arrive wait and then go together as the next one (one commit, one
multi-row enqueue for all of them), each request keeping its own answer (see
:func:`group_commit`). How the order and its task are tied, by pairing:

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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


#: The enqueue step: the tasks of these orders, on the store's connection (or ``None``);
#: one contract answer per order, in order.
Enqueue = Callable[[Sequence[NewOrder], Any], Awaitable[list[Answer]]]


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


async def save_then_enqueue(
    store: Any, orders: Sequence[NewOrder], enqueue: Enqueue
) -> list[Created]:
    """Commit the orders, then enqueue their tasks; delete an order whose enqueue fails."""
    saved: list[Order | None] = await store.insert_or_get_many(orders)
    # An order saved before, still PENDING: make sure its task exists (heals a crash
    # between save and enqueue); the derived task id makes this a no-op (200
    # already_accepted) in the normal case.
    heal = [
        i
        for i, (order, existing) in enumerate(zip(orders, saved, strict=True))
        if existing is None
        or (existing.request_hash == order.request_hash and existing.status == "PENDING")
    ]
    new = [orders[i].id for i in heal if saved[i] is None]
    try:
        answers = await enqueue([orders[i] for i in heal], None) if heal else []
    except BaseException:
        await store.delete_many(new)
        raise
    by_index = dict(zip(heal, answers, strict=True))
    # Compensation: no new order without its task.
    await store.delete_many(
        [orders[i].id for i, a in by_index.items() if saved[i] is None and not a.accepted]
    )
    out: list[Created] = []
    for i, existing in enumerate(saved):
        answer = by_index.get(i)
        if existing is None:
            out.append(Created(answer=answer))
        elif answer is not None and not answer.accepted:
            out.append(Created(answer=answer))
        else:
            out.append(Created(answer=None, existing=existing))
    return out


#: An order to save, and the enqueue step of its task.
_Job = tuple[NewOrder, Enqueue]
_WriteMany = Callable[[Sequence[NewOrder], Enqueue], Awaitable[list[Created]]]


class _MixedSteps(Exception):
    """Orders with different enqueue steps cannot share one transaction."""


def group_commit(write_many: _WriteMany) -> durq.Coalescer[_Job, Created]:
    """Orders of concurrent requests share one transaction (a :class:`durq.Coalescer`).

    The first order of an idle moment is written at once, alone (no timer: a lone request
    waits for nothing but its own transaction). Orders that arrive while a transaction is
    in flight wait for it and then go together, in arrival order, as one ``write_many``: one
    multi-row insert, one ``enqueue_many`` and one commit for all of them. So the busier the
    service, the larger the batches; on PostgreSQL at concurrency 50 this is what takes the
    API from about four round trips and a commit per order to a fraction of one.

    Every request keeps the answer it would have had alone: an order with the same id as
    one already in the batch (the same Idempotency-Key twice) waits for the next batch, so
    it finds the first one saved. A batch that fails as a whole is written again order by
    order, so an error that belongs to one order reaches that request only;
    :class:`durq.BrokerUnavailableError`, which no order of the batch would have escaped,
    goes to every request of the batch."""

    async def one(job: _Job) -> Created:
        order, enqueue = job
        (created,) = await write_many([order], enqueue)
        return created

    async def many(jobs: Sequence[_Job]) -> list[Created]:
        enqueue = jobs[0][1]
        if any(step is not enqueue for _, step in jobs):
            # One transaction runs one enqueue step: each order then goes alone. (The API
            # passes one step for every request; only callers that mix steps meet this.)
            raise _MixedSteps
        return await write_many([order for order, _ in jobs], enqueue)

    return durq.Coalescer(one, many, max_batch=200, apart=lambda job: job[0].id)


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
        self._batches = group_commit(self._create_many)

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
        return await self._batches.send((order, enqueue))

    async def _create_many(self, orders: Sequence[NewOrder], enqueue: Enqueue) -> list[Created]:
        if not self.transactional:
            return await save_then_enqueue(self, orders, enqueue)
        async with self._writing() as writer:
            saved = await writer.run(lambda conn: self._begin_and_insert(conn, orders))
            new = [order for order, existing in zip(orders, saved, strict=True) if existing is None]
            # E8: the task rows are written on this connection, in this transaction (we hold
            # the write lock, so this does not wait): each exists after COMMIT only with its
            # order. Leaving ``_writing`` rolls back whatever was not committed.
            out = _outcomes(saved, await enqueue(new, writer.conn) if new else [])
            refused = [o.id for c, o in zip(out, orders, strict=True) if _refused(c)]

            def commit(conn: sqlite3.Connection) -> None:
                for order_id in refused:  # not queued: not saved either
                    conn.execute(self.q["delete_order"], {"id": order_id})
                conn.execute("COMMIT")

            await writer.run(commit)
            return out

    def _begin_and_insert(
        self, conn: sqlite3.Connection, orders: Sequence[NewOrder]
    ) -> list[Order | None]:
        """Open the transaction and insert each order, or find the order already saved
        under its Idempotency-Key (the write lock serialises two requests with one key)."""
        conn.execute("BEGIN IMMEDIATE")
        now = time.time()
        return [self._find_or_insert(conn, order, now) for order in orders]

    def _find_or_insert(
        self, conn: sqlite3.Connection, order: NewOrder, now: float
    ) -> Order | None:
        if order.idempotency_key is not None:
            row = conn.execute(self.q["find_by_key"], _key_params(order)).fetchone()
            if row is not None:
                return Order.from_row(row)
        conn.execute(self.q["insert_order"], _params(order, now))
        return None

    async def insert_or_get_many(self, orders: Sequence[NewOrder]) -> list[Order | None]:
        """Insert the orders, or return those already saved under their Idempotency-Keys."""

        def insert(conn: sqlite3.Connection) -> list[Order | None]:
            # BEGIN IMMEDIATE takes the write lock now: two requests with one
            # Idempotency-Key are serialised, so the lookup cannot race the insert.
            saved = self._begin_and_insert(conn, orders)
            conn.execute("COMMIT")
            return saved

        async with self._writing() as writer:
            return await writer.run(insert)

    async def delete_many(self, order_ids: Sequence[str]) -> None:
        if not order_ids:
            return

        def delete(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            for order_id in order_ids:
                conn.execute(self.q["delete_order"], {"id": order_id})
            conn.execute("COMMIT")

        async with self._writing() as writer:
            await writer.run(delete)

    async def count(self) -> int:
        return await self._reader.run(
            lambda conn: int(conn.execute(self.q["count_orders"]).fetchone()[0])
        )


def _outcomes(saved: Sequence[Order | None], answers: Sequence[Answer]) -> list[Created]:
    """One :class:`Created` per order: the order saved before under its key, or the answer
    of its enqueue (``answers`` has one per new order, in order)."""
    new = iter(answers)
    return [
        Created(answer=None, existing=existing) if existing is not None else Created(next(new))
        for existing in saved
    ]


def _refused(created: Created) -> bool:
    """A new order whose task was not queued (not 202): it must not stay saved."""
    return created.answer is not None and created.answer.status_code != 202


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
        self._batches = group_commit(self._create_many)
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
        return await self._batches.send((order, enqueue))

    async def _create_many(self, orders: Sequence[NewOrder], enqueue: Enqueue) -> list[Created]:
        if not self.transactional:
            return await save_then_enqueue(self, orders, enqueue)
        async with self._pool.connection() as conn:
            try:
                async with conn.transaction():
                    saved = await self._insert_or_find(conn, orders)
                    new = [o for o, existing in zip(orders, saved, strict=True) if existing is None]
                    # E8: the task rows are written on this connection, in this transaction:
                    # each exists after COMMIT only with its order; none after ROLLBACK.
                    out = _outcomes(saved, await enqueue(new, conn) if new else [])
                    refused = [o.id for c, o in zip(out, orders, strict=True) if _refused(c)]
                    if len(refused) == len(orders):
                        raise _Rollback(out)
                    if refused:  # not queued: not saved either
                        await conn.execute(self.q["delete_orders"], {"ids": refused})
                    return out
            except _Rollback as rollback:
                return rollback.created

    async def _insert_or_find(self, conn: Any, orders: Sequence[NewOrder]) -> list[Order | None]:
        """Insert the orders in the open transaction; for each, ``None`` (inserted) or the
        order already saved under its Idempotency-Key.

        The insert comes first (one round trip when every order is new, the usual case); a
        conflict leaves the transaction usable and the saved orders are read then."""
        columns = {
            "ids": [o.id for o in orders],
            "customers": [o.customer for o in orders],
            "keys": [o.idempotency_key for o in orders],
            "hashes": [o.request_hash for o in orders],
            "items": [json.dumps(o.items, separators=(",", ":")) for o in orders],
            "task_ids": [o.task_id for o in orders],
            "now": time.time(),
        }
        cur = await conn.execute(self.q["insert_orders"], columns)
        inserted = {row["id"] for row in await cur.fetchall()}
        missing = [o for o in orders if o.id not in inserted]
        if not missing:
            return [None] * len(orders)
        keyed = [o for o in missing if o.idempotency_key is not None]
        found: dict[str, Order] = {}
        if keyed:
            cur = await conn.execute(
                self.q["find_by_keys"],
                {
                    "customers": [o.customer for o in keyed],
                    "keys": [o.idempotency_key for o in keyed],
                },
            )
            for row in await cur.fetchall():
                order = Order.from_row(row)
                found[f"{order.customer}\0{order.idempotency_key}"] = order
        out: list[Order | None] = []
        for order in orders:
            if order.id in inserted:
                out.append(None)
                continue
            existing = found.get(f"{order.customer}\0{order.idempotency_key}")
            if existing is None:
                raise RuntimeError(f"order {order.id} conflicts with an order of another key")
            out.append(existing)
        return out

    async def insert_or_get_many(self, orders: Sequence[NewOrder]) -> list[Order | None]:
        async with self._pool.connection() as conn, conn.transaction():
            return await self._insert_or_find(conn, orders)

    async def delete_many(self, order_ids: Sequence[str]) -> None:
        if order_ids:
            await self._write("delete_orders", {"ids": list(order_ids)})

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
    """Leave the transaction without committing, then answer ``created``."""

    def __init__(self, created: list[Created]) -> None:
        super().__init__("rollback")
        self.created = created


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
