"""A worker's statements keep the plan they were first given: the pool's connections run one
generic plan per prepared statement, often made while the tasks table was still empty and
had no statistics. The writes of a claim, of its forwarding step and of the promoter must
then still go straight to the rows they locked, however long the queue's history has grown
since. A completion finds the tasks waiting for it by their keys, never by reading the
table. Counted in buffers and plan nodes on the real server (auto_explain), not timed.

Those writes go through each row's address (ctid), which has one consequence tested here
too: a row another transaction changed between the claim's snapshot and its lock is locked
but not leased. The claim then claims again at once, and the claim of limited tasks counts
no running slot for it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.brokers.postgres import PostgresBroker
from durq.task import LimitSpec

#: Completed tasks added to the queue after the plans were made.
HISTORY = 3000
#: Buffers one statement may touch with that history: a plan that reads the queue's rows
#: to find the ones it locked touches about one per row.
MOST_BUFFERS = 300


#: How each statement of concern is told apart in the server's report.
MARKERS = {
    "claim": "forward_first AS",
    "limited_due": "d.limits::text AS limits",
    "lock_limits": "AS l WHERE l.queue = x.queue AND l.key = x.key",
    "lease_rows": "AS x(ctid)\n",
    "claim_forward": "CROSS JOIN LATERAL (\n        SELECT * FROM",
    "promote_due": "moved AS",
    "complete": "AS released\nFROM ended AS d",
    "complete_claim": "dep_take AS",
}


def task(
    *, delay: float | None = None, limited: bool = False, after: EnqueueParams | None = None
) -> EnqueueParams:
    return EnqueueParams(
        id=uuid.uuid4().hex,
        queue="default",
        type="t",
        payload=b"{}",
        process_in=delay,
        limits=(LimitSpec("k", concurrency=5),) if limited else (),
        after=() if after is None else ((after.queue, after.id),),
    )


async def claim_all(broker: PostgresBroker, n: int) -> None:
    leases = []
    for _ in range(20):
        leases += await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        if len(leases) == n:
            break
    assert len(leases) == n, leases
    for lease in leases:
        assert await broker.complete(CompleteParams(lease.ref))


async def one_round(broker: PostgresBroker) -> None:
    """Tasks of each kind claimed and completed: the claim, its forwarding step (a due
    scheduled task), the claim of limited tasks, and the promoter's forwarding."""
    await broker.enqueue_many([task(), task(delay=0.01), task(limited=True)])
    await asyncio.sleep(0.02)
    await claim_all(broker, 3)
    await broker.enqueue_many([task(delay=0.01)])
    await asyncio.sleep(0.02)
    assert await broker.promote_due() == 1
    await claim_all(broker, 1)
    await dependency_round(broker)


async def dependency_round(broker: PostgresBroker) -> None:
    """Completions that release a waiting task: complete, then complete_claim (which leases
    the task it releases)."""
    for ride in (False, True):
        first = task()
        await broker.enqueue_many([first])
        await broker.enqueue_many([task(after=first)])
        (lease,) = await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        if ride:
            claim = ClaimParams(["default"], 10, "w", 30.0)
            done, leases = await broker.complete_and_claim([CompleteParams(lease.ref)], claim)
            assert done == [True] and len(leases) == 1
            assert await broker.complete(CompleteParams(leases[0].ref))
        else:
            assert await broker.complete(CompleteParams(lease.ref))
            await claim_all(broker, 1)


def buffers(node: dict[str, Any]) -> int:
    """The most buffers any node of a plan touched (a node counts those of its children)."""
    own = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    return max([own, *(buffers(child) for child in node.get("Plans", ()))])


async def test_claims_planned_on_an_empty_table_do_not_read_the_queue_history(
    pg_url: str, schema: str
) -> None:
    broker = PostgresBroker.from_url(f"{pg_url}&pool_max=1")  # one connection: one plan cache
    try:
        await broker.migrate()
        async with broker._storage.connection("test") as conn:
            # Only the plans made here count: an ANALYZE by autovacuum would plan again.
            await conn.execute(
                sql.SQL("ALTER TABLE {}.tasks SET (autovacuum_enabled = false)").format(
                    sql.Identifier(schema)
                )
            )
        for _ in range(6):  # psycopg prepares a statement at its fifth call on a connection
            await one_round(broker)

        async with broker._storage.connection("test") as conn:
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {}.tasks (queue, id, type, payload, state, max_retry,"
                    " next_process_at, enqueued_at, expires_at)"
                    " SELECT 'default', 'done-' || i, 't', '\\x7b7d', 'completed', 0, 0, 0, 1e12"
                    " FROM generate_series(1, %s) AS i"
                ).format(sql.Identifier(schema)),
                (HISTORY,),
            )
            try:
                await conn.execute("LOAD 'auto_explain'")
            except psycopg.errors.InsufficientPrivilege:
                pytest.skip("auto_explain needs a superuser connection")
            for setting in (
                "auto_explain.log_min_duration = 0",
                "auto_explain.log_analyze = on",
                "auto_explain.log_buffers = on",
                "auto_explain.log_timing = off",
                "auto_explain.log_format = json",
                "auto_explain.log_level = notice",
            ):
                await conn.execute(f"SET {setting}")
        plans: list[str] = []

        def keep(diag: psycopg.errors.Diagnostic) -> None:
            plans.append(diag.message_primary or "")

        conn.add_notice_handler(keep)
        await one_round(broker)
        conn.remove_notice_handler(keep)

        seen: set[str] = set()
        heavy: list[tuple[int, str]] = []
        for message in plans:
            plan = json.loads(message.split("plan:", 1)[1])
            text = plan["Query Text"]
            seen.update(name for name, marker in MARKERS.items() if marker in text)
            if (n := buffers(plan["Plan"])) >= MOST_BUFFERS:
                heavy.append((n, text[:200]))

        # The statements of concern ran (the test would otherwise prove nothing), and no
        # statement of the round read the history.
        assert seen == set(MARKERS), seen
        assert not heavy, heavy
    finally:
        await broker.close()


async def explained(broker: PostgresBroker, run: Callable[[], Awaitable[None]]) -> list[Any]:
    """The plans (auto_explain, JSON) of the statements ``run`` sends on the broker's one
    pooled connection."""
    async with broker._storage.connection("test") as conn:
        try:
            await conn.execute("LOAD 'auto_explain'")
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("auto_explain needs a superuser connection")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_timing = off",
            "auto_explain.log_format = json",
            "auto_explain.log_level = notice",
        ):
            await conn.execute(f"SET {setting}")
    plans: list[Any] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        plans.append(json.loads((diag.message_primary or "").split("plan:", 1)[1]))

    conn.add_notice_handler(keep)
    try:
        await run()
    finally:
        conn.remove_notice_handler(keep)
    return plans


def table_scans(node: dict[str, Any]) -> int:
    """How many nodes of a plan read the whole tasks table."""
    own = node.get("Node Type") == "Seq Scan" and node.get("Relation Name") == "tasks"
    return int(own) + sum(table_scans(child) for child in node.get("Plans", ()))


async def test_a_completion_finds_the_tasks_waiting_for_it_by_their_keys(
    pg_url: str, schema: str
) -> None:
    """The count-down of waiting tasks, in complete and in complete_claim, on a table of
    some history with its statistics: each completion names a few waiting tasks, which the
    plan estimated at a hundred (jsonb_array_elements) and fetched by reading the table."""
    broker = PostgresBroker.from_url(f"{pg_url}&pool_max=1")  # one connection: one plan cache
    try:
        await broker.migrate()
        async with broker._storage.connection("test") as conn:
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {}.tasks (queue, id, type, payload, state, max_retry,"
                    " next_process_at, enqueued_at, expires_at)"
                    " SELECT 'default', 'done-' || i, 't', '\\x7b7d', 'completed', 0, 0, 0, 1e12"
                    " FROM generate_series(1, %s) AS i"
                ).format(sql.Identifier(schema)),
                (HISTORY,),
            )
            await conn.execute(sql.SQL("ANALYZE {}.tasks").format(sql.Identifier(schema)))

        async def rounds() -> None:
            for _ in range(7):  # prepared at the fifth call: custom plans, then the generic one
                await dependency_round(broker)

        plans = await explained(broker, rounds)
        counting = [p for p in plans if "dep_locked AS" in p["Query Text"]]
        assert {"dep_take AS" in p["Query Text"] for p in counting} == {True, False}
        assert [table_scans(p["Plan"]) for p in counting] == [0] * len(counting)
    finally:
        await broker.close()


async def refuse_first_lease(broker: PostgresBroker, schema: str) -> None:
    """A trigger that lets the first lease of a row fail to be written, as when another
    transaction changed the row after the claim's snapshot and before its lock: the claim
    locked it but leased nothing."""
    s = sql.Identifier(schema)
    async with broker._storage.connection("test") as conn:
        await conn.execute(sql.SQL("CREATE TABLE {}.refused (n integer)").format(s))
        await conn.execute(
            sql.SQL(
                """CREATE FUNCTION {}.refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NOT EXISTS (SELECT 1 FROM {}.refused) THEN
                        INSERT INTO {}.refused VALUES (1);
                        RETURN NULL;
                    END IF;
                    RETURN NEW;
                END $$"""
            ).format(s, s, s)
        )
        await conn.execute(
            sql.SQL(
                "CREATE TRIGGER refuse_once BEFORE UPDATE ON {}.tasks FOR EACH ROW"
                " WHEN (OLD.state = 'pending' AND NEW.state = 'active')"
                " EXECUTE FUNCTION {}.refuse_once()"
            ).format(s, s)
        )


async def test_a_claim_that_locked_a_moved_row_claims_again_at_once(
    pg_url: str, schema: str
) -> None:
    broker = PostgresBroker.from_url(pg_url)
    try:
        await broker.migrate()
        await refuse_first_lease(broker, schema)
        await broker.enqueue(task())
        (lease,) = await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        assert await broker.complete(CompleteParams(lease.ref))
    finally:
        await broker.close()


async def test_a_limited_task_not_leased_takes_no_slot(pg_url: str, schema: str) -> None:
    """A row the claim of limited tasks decided to lease but could not write rolls the
    claim back: the key's slot stays free for the next claim."""
    broker = PostgresBroker.from_url(pg_url)
    try:
        await broker.migrate()
        await refuse_first_lease(broker, schema)
        await broker.enqueue(task(limited=True))
        leases = []
        for _ in range(3):
            leases += await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        assert len(leases) == 1
        (limit,) = await broker.admin.list_limits("default")
        assert limit.running == 1
        assert await broker.complete(CompleteParams(leases[0].ref))
    finally:
        await broker.close()
