"""Fixtures of the PostgreSQL-only tests: an isolated schema per test, dropped at teardown."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from durq.brokers.postgres import PostgresBroker
from durq.clock import FakeClock
from servers import PG_DSN, require_server, unique_name


def drop_schema(schema: str) -> None:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def schema() -> Iterator[str]:
    require_server("postgres")
    name = unique_name("durq_pg")
    yield name
    drop_schema(name)


@pytest.fixture
def pg_url(schema: str) -> str:
    return f"{PG_DSN}?schema={schema}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_pg(
    pg_url: str, clock: FakeClock
) -> AsyncIterator[Callable[..., Awaitable[PostgresBroker]]]:
    """Open more brokers on the same schema (migrated and connected), closed at teardown."""
    opened: list[PostgresBroker] = []

    async def factory(*, migrate: bool = True, connect: bool = True) -> PostgresBroker:
        broker = PostgresBroker.from_url(pg_url, clock=clock)
        opened.append(broker)
        if migrate:
            await broker.migrate()
        if connect:
            await broker.connect()
        return broker

    yield factory
    for broker in opened:
        await broker.close()


@pytest.fixture
async def pg(make_pg: Callable[..., Awaitable[PostgresBroker]]) -> PostgresBroker:
    return await make_pg()
