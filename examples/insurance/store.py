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
import json
import os
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

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


class SQLiteOrderStore(_OrderQueries):
    """Orders in a SQLite file; sqlite3 calls run in threads.

    ``transactional``: the file is also the SQLite broker's, so an order and its task are
    written in one transaction (E8)."""

    def __init__(self, path: str, *, transactional: bool = False) -> None:
        self.path = path
        self.transactional = transactional
        self.q = load_queries("sqlite")

    @classmethod
    def from_url(cls, url: str, *, transactional: bool = False) -> SQLiteOrderStore:
        return cls(sqlite_path(url), transactional=transactional)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=10.0, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    async def _in_thread(self, use: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``use`` on a fresh connection in a thread (sqlite3 blocks), then close it."""

        def run() -> _T:
            conn = self._connect()
            try:
                return use(conn)
            finally:
                conn.close()

        return await asyncio.to_thread(run)

    async def _write(self, name: str, params: dict[str, Any]) -> int:
        return await self._in_thread(lambda conn: conn.execute(self.q[name], params).rowcount)

    async def _one(self, name: str, params: dict[str, Any]) -> Order | None:
        def one(conn: sqlite3.Connection) -> Order | None:
            row = conn.execute(self.q[name], params).fetchone()
            return Order.from_row(row) if row is not None else None

        return await self._in_thread(one)

    async def open(self) -> None:
        await self._in_thread(lambda conn: conn.executescript(self.q["create_schema"]))

    async def close(self) -> None:
        return None

    async def create(self, order: NewOrder, enqueue: Enqueue) -> Created:
        if not self.transactional:
            return await save_then_enqueue(self, order, enqueue)
        conn = await asyncio.to_thread(self._connect)
        try:
            # BEGIN IMMEDIATE (waiting for the write lock) in a thread, never on the loop.
            existing = await asyncio.to_thread(self._begin_and_insert, conn, order)
            if existing is not None:
                conn.execute("ROLLBACK")
                return Created(answer=None, existing=existing)
            try:
                # E8: the task row is written on this connection, in this transaction (we hold
                # the write lock, so this does not wait): both exist after COMMIT, neither
                # after ROLLBACK.
                answer = await enqueue(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            if answer.status_code != 202:
                conn.execute("ROLLBACK")
                return Created(answer=answer)
            await asyncio.to_thread(conn.execute, "COMMIT")
            return Created(answer=answer)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

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
            conn.execute("BEGIN IMMEDIATE")
            try:
                return self._find_or_insert(conn, order)
            finally:
                conn.execute("COMMIT")

        return await self._in_thread(insert)

    async def count(self) -> int:
        return await self._in_thread(
            lambda conn: int(conn.execute(self.q["count_orders"]).fetchone()[0])
        )


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
        """Insert ``order`` in the open transaction, or return the one saved under its key."""
        existing = await self._find(conn, order)
        if existing is None:
            await conn.execute(self.q["insert_order"], _params(order, time.time()))
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
    database_url: str, schema: str, *, transactional: bool, broker_url: str | None = None
) -> OrderStore:
    """The store for ``database_url`` (``sqlite:///…`` or ``postgresql://…``).

    ``transactional``: the broker can join the store's transactions (E8); on SQLite only
    when the orders live in the broker's own file (``broker_url``)."""
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
        return SQLiteOrderStore.from_url(database_url, transactional=transactional and same_file)
    raise ValueError(f"unsupported INSURANCE_DATABASE_URL scheme {scheme!r}")
