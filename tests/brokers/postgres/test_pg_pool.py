"""The worker's pool gives back the connections a burst opened (``pool_max_idle``), counted
on the real server by ``application_name``."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import durq
from conformance.apps import wait_until
from durq.brokers.postgres import PostgresBroker
from durq.errors import ConfigurationError
from servers import PG_DSN, unique_name


async def server_connections(tag: str) -> int:
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_a_url_with_no_host_keeps_its_form(schema: str) -> None:
    """``postgresql:///db?host=...`` (how a local socket is named) still reads as a URL once
    durq's own options are taken out of it; put back together by urlunsplit it became
    ``postgresql:/db?...``, which libpq refused."""
    parts = urlsplit(PG_DSN)
    url = f"postgresql://{parts.path}?host={parts.hostname}&port={parts.port or 5432}"
    url += f"&user={parts.username or 'postgres'}&schema={schema}&pool_max=2"
    dsn, options = PostgresBroker.parse_url(url)
    assert dsn.startswith("postgresql:///") and options == {"schema": schema, "pool_max": 2}
    broker = PostgresBroker.from_url(url)
    try:
        await broker.migrate()
        await broker.connect()
    finally:
        await broker.close()


def test_pool_max_idle_is_ours_and_checked() -> None:
    dsn, options = PostgresBroker.parse_url(f"{PG_DSN}?pool_max_idle=2.5&sslmode=disable")
    assert options == {"pool_max_idle": 2.5} and "pool_max_idle" not in dsn
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ConfigurationError, match="pool_max_idle"):
            PostgresBroker.parse_url(f"{PG_DSN}?pool_max_idle={bad}")


async def test_idle_worker_closes_what_a_burst_opened(pg_url: str) -> None:
    tag = unique_name("durqpool")
    app = durq.App(f"{pg_url}&application_name={tag}&pool_max=5&pool_max_idle=1")
    await app.new_broker().migrate()
    done: list[int] = []

    @app.task("pool:leaf", queue="pool")
    async def leaf(payload: dict[str, Any]) -> None:
        done.append(1)

    @app.task("pool:fan", queue="pool")
    async def fan(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.05)  # overlap the handlers: their enqueues grow the pool
        await leaf.enqueue({})

    producer = durq.App(pg_url)
    peak = 0
    try:
        async with app.worker(queues=["pool"], concurrency=10, shutdown_timeout=5):
            await producer.enqueue_many(
                [durq.EnqueueRequest("pool:fan", {}, queue="pool") for _ in range(60)]
            )

            async def drained() -> bool:
                nonlocal peak
                peak = max(peak, await server_connections(tag))
                return len(done) == 60

            await wait_until(drained, timeout=60)
            assert peak >= 4, f"the burst should have grown the pool (peak {peak})"

            # Idle now: the pool closes an unused connection every second, down to what the
            # worker's own ticks keep using (one or two) and the LISTEN connection.
            async def shrunk() -> bool:
                return await server_connections(tag) <= 3

            await wait_until(shrunk, timeout=60)
    finally:
        await app.close()
        await producer.close()


async def test_pooled_connections_keep_one_generic_plan_per_statement(pg_url: str) -> None:
    """The pool's connections run prepared statements on one generic plan: left to choose,
    the server planned the claim again on every call after a backlog (more than half of an
    idle claim's time). Each of a claim's prepared executions shows as a generic plan."""
    from durq.brokers.base import ClaimParams

    broker = PostgresBroker.from_url(f"{pg_url}&pool_max=1")
    try:
        await broker.migrate()
        for _ in range(12):  # psycopg prepares a statement at its fifth call on a connection
            await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        async with broker._storage.connection("test") as conn:
            cur = await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%forward_first%'"
            )
            plans = await cur.fetchall()
        assert plans and all(p["custom_plans"] == 0 and p["generic_plans"] > 0 for p in plans)
    finally:
        await broker.close()


async def prepared(broker: PostgresBroker) -> list[str]:
    """The statements prepared in the session of the pooled connection it gets (the only
    one with pool_max=1; a new one when the others are busy)."""
    async with broker._storage.connection("test") as conn:
        cur = await conn.execute("SELECT statement FROM pg_prepared_statements")
        return [row["statement"] for row in await cur.fetchall()]


@pytest.mark.parametrize("pgbouncer", [False, True])
async def test_the_workers_statements_are_prepared_at_their_first_call(
    pg_url: str, pgbouncer: bool
) -> None:
    """The pool hands its connections out in turn, so a statement prepared at its fifth call
    on a connection ran unprepared, planned anew each time, five times on each of them: after
    a busy spell, the first pickups of an idle worker took 2-3 ms more. Behind PgBouncer
    nothing is prepared (a statement lives in one server session)."""
    from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams

    broker = PostgresBroker.from_url(f"{pg_url}&pool_max=1&pgbouncer={int(pgbouncer)}")
    try:
        await broker.migrate()
        await broker.enqueue_many([EnqueueParams(id="a", queue="default", type="t", payload=b"")])
        leases = await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        assert [lease.ref.id for lease in leases] == ["a"]
        assert await broker.complete(CompleteParams(leases[0].ref))
        statements = await prepared(broker)
    finally:
        await broker.close()
    if pgbouncer:
        assert statements == []
    else:
        for marker in ("forward_first AS", "INSERT INTO", "kept AS"):
            assert any(marker in s for s in statements), (marker, statements)


async def test_new_connections_of_a_claiming_broker_have_the_idle_claim_ready(
    pg_url: str,
) -> None:
    """A busy worker claims with its acks and spreads them over the pool's connections in
    turn; once idle, its first claim on each connection would be planned then, 1.5-3 ms more
    for the pickup. A broker that has claimed runs the idle claim on each new connection
    (on a queue no task can be in); one that only enqueues does not."""
    from durq.brokers.base import ClaimParams, EnqueueParams

    broker = PostgresBroker.from_url(f"{pg_url}&pool_max=3")
    try:
        await broker.migrate()
        async with broker._storage.connection("hold"):  # the pool's first connection, busy
            assert not any("forward_first AS" in s for s in await prepared(broker))
        assert await broker.claim(ClaimParams(["default"], 10, "w", 30.0)) == []
        # A task in the queue that claim named: the warm-up must not take it.
        await broker.enqueue_many([EnqueueParams(id="a", queue="default", type="t", payload=b"")])
        async with broker._storage.connection("hold"), broker._storage.connection("hold"):
            # Both connections are busy: the next one is new.
            statements = await prepared(broker)
        assert any("forward_first AS" in s for s in statements), statements
        assert (await broker.admin.get_task("default", "a")).state.value == "pending"
    finally:
        await broker.close()


async def test_behind_pgbouncer_the_pool_leaves_the_plan_choice_to_the_server(pg_url: str) -> None:
    """A session setting would reach other clients' sessions through PgBouncer's transaction
    pooling (and its statements are not prepared): the pool does not set it there."""
    broker = PostgresBroker.from_url(f"{pg_url}&pool_max=1&pgbouncer=true")
    try:
        await broker.migrate()
        async with broker._storage.connection("test") as conn:
            cur = await conn.execute("SHOW plan_cache_mode")
            row = await cur.fetchone()
        assert row is not None and row["plan_cache_mode"] == "auto"
    finally:
        await broker.close()
