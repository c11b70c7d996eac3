"""Ends of tasks on PostgreSQL: a completion announces the end (a NOTIFY on the schema's end
channel, which ``App.wait`` listens to) of the tasks someone waits for, and only those: the
others cost no notification."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams, Lease
from durq.brokers.postgres import PostgresBroker
from servers import PG_DSN


def task(task_id: str) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="default", type="t", payload=b"{}")


async def heard_until(broker: PostgresBroker, act: Callable[[], Any], last: str) -> list[str]:
    """The end notifications sent while ``act`` runs, up to and including ``last`` (the
    notifier sends them in order, after each commit)."""
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(broker._storage.end_channel)))
        await act()
        payloads: list[str] = []
        async with asyncio.timeout(30):
            async for note in conn.notifies():
                payloads.append(note.payload)
                if last in note.payload.splitlines():
                    return payloads
        raise AssertionError("unreachable")


async def complete(broker: PostgresBroker, *leases: Lease) -> None:
    refs = [CompleteParams(lease.ref, retention=60) for lease in leases]
    done, _ = await broker.complete_and_claim(refs, ClaimParams(["default"], 2, "w", 30))
    assert done == [True] * len(leases)


async def test_only_watched_tasks_have_their_end_announced(pg: PostgresBroker) -> None:
    await pg.enqueue_many([task(i) for i in ("plain", "waited", "alone", "sentinel")])
    claimed = await pg.claim(ClaimParams(["default"], 4, "w", 30))
    leases = {lease.task.id: lease for lease in claimed}
    async with pg.watch_end("default", "waited") as watch:
        payloads = await heard_until(
            pg, lambda: complete(pg, leases["plain"], leases["waited"]), "default waited"
        )
        assert payloads == ["default waited"]
        assert await watch.wait(1.0)
    # Nobody waits for "alone": nothing is announced before the sentinel's end, sent after.
    async with pg.watch_end("default", "sentinel"):

        async def alone_then_sentinel() -> None:
            assert await pg.complete_many([CompleteParams(leases["alone"].ref)]) == [True]
            await complete(pg, leases["sentinel"])

        payloads = await heard_until(pg, alone_then_sentinel, "default sentinel")
        assert payloads == ["default sentinel"]


async def test_a_wait_that_starts_after_the_end_reads_it(pg: PostgresBroker) -> None:
    """Marking a task that has ended already changes nothing: the wait's read finds the end."""
    await pg.enqueue(task("t"))
    (lease,) = await pg.claim(ClaimParams(["default"], 1, "w", 30))
    assert await pg.complete_many([CompleteParams(lease.ref, retention=60)]) == [True]
    async with pg.watch_end("default", "t"):
        assert (await pg.admin.get_task("default", "t")).state.value == "completed"
