"""Bad input and unreachable servers: typed errors, promptly, never a hang (E7)."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from durq.brokers import open_broker
from durq.brokers.base import EnqueueParams
from durq.brokers.postgres import PostgresBroker
from durq.errors import BrokerError, BrokerUnavailableError, ConfigurationError
from servers import PG_DSN, require_server, unique_name


def task(task_id: str) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="default", type="t", payload=b"{}")


async def test_refused_port_is_unavailable_at_once() -> None:
    broker = open_broker("postgresql://postgres@127.0.0.1:1/test?schema=durq")
    start = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as caught:
        await broker.connect()
    assert caught.value.operation == "postgres.connect"
    with pytest.raises(BrokerUnavailableError) as caught:
        await broker.enqueue(task("a"))
    assert caught.value.operation == "postgres.enqueue"
    assert time.monotonic() - start < 3
    await broker.close()


async def test_unroutable_host_is_bounded_by_the_connect_timeout() -> None:
    # A black-holed address never answers: the connect timeout bounds the wait.
    broker = open_broker("postgresql://postgres@10.255.255.1:5432/test?connect_timeout=2")
    start = time.monotonic()
    with pytest.raises(BrokerUnavailableError):
        await broker.ping()
    assert time.monotonic() - start < 6
    await broker.close()


async def test_unknown_database_names_the_cause() -> None:
    require_server("postgres")
    broker = open_broker("postgresql://postgres@127.0.0.1:5432/no_such_db_durq")
    with pytest.raises(BrokerUnavailableError, match="no_such_db_durq"):
        await broker.connect()
    await broker.close()


async def test_unknown_role_names_the_cause() -> None:
    require_server("postgres")
    broker = open_broker("postgresql://no_such_role_durq@127.0.0.1:5432/test")
    with pytest.raises(BrokerUnavailableError, match="no_such_role_durq"):
        await broker.connect()
    await broker.close()


def test_invalid_schema_name_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        PostgresBroker.from_url(f"{PG_DSN}?schema=bad;name")


def test_url_parsing_strips_our_options() -> None:
    dsn, options = PostgresBroker.parse_url(
        "postgres://u@h:5433/db?schema=s1&pool_max=3&sslmode=disable&connect_timeout=7"
    )
    assert dsn == "postgresql://u@h:5433/db?sslmode=disable&connect_timeout=7"
    assert options == {"schema": "s1", "pool_max": 3, "connect_timeout": 7.0}


async def test_missing_privileges_are_a_broker_error(pg, schema: str) -> None:
    """A role without rights on the schema gets a typed error naming the operation."""
    role = unique_name("durq_noperm")
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON {}.schema_migrations TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
    try:
        url = PG_DSN.replace("postgres@", f"{role}@", 1) + f"?schema={schema}"
        broker = PostgresBroker.from_url(url)
        try:
            await broker.connect()  # the version check is allowed
            with pytest.raises(BrokerError, match="permission denied") as caught:
                await broker.enqueue(task("a"))
            assert caught.value.operation == "postgres.enqueue"
        finally:
            await broker.close()
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
