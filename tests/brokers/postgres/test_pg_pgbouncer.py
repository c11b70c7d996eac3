"""PostgreSQL behind PgBouncer (transaction pooling) without a direct ``listen_url``: workers
poll, say so once, and still run every task. The rest of the contract through PgBouncer is
the conformance suite's ``postgres-pgbouncer`` kind."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlencode

import pytest

import durq
from conformance.apps import FAST, wait_for_state
from durq.brokers.base import CAP_CROSS_PROCESS_NOTIFY
from durq.brokers.postgres import PostgresBroker
from durq.errors import ConfigurationError
from durq.states import TaskState
from servers import PG_DSN, PgBouncer


def bouncer_url(bouncer: PgBouncer, schema: str, **options: str) -> str:
    query = urlencode({"schema": schema, **options})
    return f"postgresql://{bouncer.user}@127.0.0.1:{bouncer.port}/{bouncer.database}?{query}"


async def test_without_listen_url_workers_poll_and_warn_once(
    pgbouncer: PgBouncer, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = durq.App(bouncer_url(pgbouncer, schema, pgbouncer="1"))
    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    ran: list[int] = []

    @app.task("poll:job", retention=60)
    def job(payload: dict[str, Any]) -> int:
        ran.append(int(payload["n"]))
        return int(payload["n"])

    caplog.set_level(logging.WARNING, logger="durq.brokers.postgres")
    try:
        async with app.worker(**FAST):
            infos = [await job.enqueue({"n": n}) for n in range(3)]
            for info in infos:
                await wait_for_state(app, "default", info.id, TaskState.COMPLETED, timeout=15)
    finally:
        await app.close()
    assert sorted(ran) == [0, 1, 2]
    warnings = [r.getMessage() for r in caplog.records if "listen_url" in r.getMessage()]
    assert len(warnings) == 1 and "poll" in warnings[0]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("pgbouncer=maybe", "pgbouncer must be"),
        ("pgbouncer=1&listen_url=redis://127.0.0.1:6379/0", "listen_url must be"),
    ],
)
def test_bad_pgbouncer_options_are_configuration_errors(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        PostgresBroker.from_url(f"{PG_DSN}?{query}")


#: What a client that prepares statements gets from a transaction pooler (psycopg names its
#: statements _pg3_N): each server session holds the statements of whichever client ran there.
PREPARED_ERRORS = ("already exists", "does not exist", "bind message supplies", "pool initializ")


@pytest.mark.parametrize("options", [{}, {"listen_url": PG_DSN}])
async def test_a_transaction_pooler_is_found_at_connect_without_the_url_option(
    pgbouncer: PgBouncer, schema: str, caplog: pytest.LogCaptureFixture, options: dict[str, str]
) -> None:
    """Without ``pgbouncer=1`` the broker sees at connect that one client connection does not
    keep one server session, stops preparing statements, says so once, and works: enqueues
    from several connections at once and a worker claiming and completing them."""
    caplog.set_level(logging.DEBUG)
    app = durq.App(bouncer_url(pgbouncer, schema, pool_max="4", **options))
    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    ran: list[int] = []

    @app.task("bouncer:job", retention=60)
    def job(payload: dict[str, Any]) -> int:
        ran.append(int(payload["n"]))
        return int(payload["n"])

    try:
        async with app.worker(**FAST, concurrency=4):
            infos = await asyncio.gather(*(job.enqueue({"n": n}) for n in range(20)))
            for info in infos:
                await wait_for_state(app, "default", info.id, TaskState.COMPLETED, timeout=20)
    finally:
        await app.close()
    assert sorted(ran) == list(range(20))
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if any(e in m for e in PREPARED_ERRORS)], messages
    found = [m for m in messages if "transaction-pooling" in m]
    assert found and all("pgbouncer=1" in m for m in found), messages


async def test_straight_to_postgresql_nothing_is_found(pg_url: str) -> None:
    """No false alarm: a broker straight to PostgreSQL keeps its prepared statements."""
    broker = PostgresBroker.from_url(pg_url)
    await broker.migrate()
    try:
        await broker.connect()
        assert broker.capabilities >= {CAP_CROSS_PROCESS_NOTIFY}
        assert "prepare_threshold" not in broker._storage.connect_kwargs()
    finally:
        await broker.close()


async def test_pgbouncer_0_through_a_pooler_stops_with_one_line_naming_the_option(
    pgbouncer: PgBouncer, schema: str
) -> None:
    """``pgbouncer=0`` skips the check; when a prepared statement then meets another
    client's in the pooler's session, the error names the option instead of a pool
    timeout ("pool initialization incomplete")."""
    url = bouncer_url(pgbouncer, schema, pgbouncer="0", connect_timeout="2", pool_max="1")
    first, second = PostgresBroker.from_url(url), PostgresBroker.from_url(url)
    await first.migrate()
    try:
        await first.connect()  # its pooled connection prepares a statement in the session
        with pytest.raises(ConfigurationError) as caught:
            await second.connect()  # ...that the pooler hands to this one's new connection
    finally:
        await first.close()
        await second.close()
    message = str(caught.value)
    assert "pgbouncer=1" in message and "transaction-pooling" in message
    assert "\n" not in message
