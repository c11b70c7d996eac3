"""Ends of tasks on PostgreSQL: a completion announces the end (a NOTIFY on the schema's end
channel, which ``App.wait`` listens to) of the tasks someone waits for, and only those: the
others cost no notification."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.brokers.postgres import PostgresBroker
from servers import PG_DSN


def task(task_id: str) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="default", type="t", payload=b"{}")


async def heard(broker: PostgresBroker, act: Callable[[], Any]) -> list[str]:
    """The end notifications sent while ``act`` runs (and its background sends settle)."""
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(broker._s.end_channel)))
        await act()
        await asyncio.sleep(0.3)  # the notifier sends after the commit, off the caller's path
        await conn.execute("SELECT 1")  # notifications arrive with the next answer
        payloads: list[str] = []
        async for note in conn.notifies(timeout=0.2):
            payloads.append(note.payload)
        return payloads


async def test_only_watched_tasks_have_their_end_announced(pg: PostgresBroker) -> None:
    await pg.enqueue_many([task("plain"), task("waited"), task("alone")])
    leases = {
        lease.task.id: lease for lease in await pg.claim(ClaimParams(["default"], 3, "w", 30))
    }
    async with pg.watch_end("default", "waited") as watch:

        async def complete_in_claim() -> None:
            refs = [CompleteParams(leases[i].ref, retention=60) for i in ("plain", "waited")]
            done, _ = await pg.complete_and_claim(refs, ClaimParams(["default"], 2, "w", 30))
            assert done == [True, True]

        assert await heard(pg, complete_in_claim) == ["default waited"]
        assert await watch.wait(1.0)

    # complete_many: the same statement as a claim's, without the claim
    async def complete_alone() -> None:
        assert await pg.complete_many([CompleteParams(leases["alone"].ref)]) == [True]

    assert await heard(pg, complete_alone) == []


async def test_a_wait_that_starts_after_the_end_reads_it(pg: PostgresBroker) -> None:
    """Marking a task that has ended already changes nothing: the wait's read finds the end."""
    await pg.enqueue(task("t"))
    (lease,) = await pg.claim(ClaimParams(["default"], 1, "w", 30))
    assert await pg.complete_many([CompleteParams(lease.ref, retention=60)]) == [True]
    async with pg.watch_end("default", "t"):
        assert (await pg.get_task("default", "t")).state.value == "completed"
