"""Groups of the maximum size on PostgreSQL, right after they were enqueued: the tables have
no statistics for those rows yet, so a statement over a group's members must not depend on
the planner's estimates. Counted in buffers on the real server, not timed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

import durq
from conformance.apps import check_group_made_before_upgrade
from durq import groups
from durq.brokers.postgres import PostgresBroker
from durq.brokers.postgres.storage import QUERIES, render
from durq.states import TaskState
from servers import PG_DSN

#: Buffers a bulk delete may touch per member: an index entry, its task by primary key,
#: the updated row and its index entries (about 10); a nested loop over the members and
#: the state's tasks touched over 160.
MOST_BUFFERS_PER_MEMBER = 20


def buffers(node: dict[str, Any]) -> int:
    """The most buffers any node of a plan touched (a node counts those of its children)."""
    own = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    return max([own, *(buffers(child) for child in node.get("Plans", ()))])


async def test_deleting_every_member_of_the_largest_group_reads_each_member_once(
    schema: str, make_pg: Callable[..., Awaitable[PostgresBroker]]
) -> None:
    broker = await make_pg()
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for table in ("tasks", "group_members"):  # no statistics until the test ends
            conn.execute(
                sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(
                    sql.Identifier(schema, table)
                )
            )
    app = durq.App(broker)
    size = groups.MAX_MEMBERS
    members = [app.params(durq.EnqueueRequest("m:x", {}, process_in=60)) for _ in range(size)]
    await broker.enqueue_group(
        groups.build("g", members, "m:done", app, retention=60, max_payload=app.max_payload)
    )
    # The statement that finishes the members of a bulk delete, rolled back.
    text = render(QUERIES["forget_members_in_state"], schema).decode()
    with psycopg.connect(PG_DSN) as conn:
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text,
            {"queue": "default", "state": "scheduled"},
        ).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert plan["Actual Rows"] == size
    assert buffers(plan) <= MOST_BUFFERS_PER_MEMBER * size, json.dumps(plan, indent=1)
    # The delete itself: every member finishes as deleted, one follow-up.
    assert await broker.admin.move_all("default", TaskState.SCHEDULED, None) == size
    follow = await broker.admin.get_task("default", groups.follow_up_id("g"))
    states = {m["state"] for m in json.loads(follow.raw_payload)["members"]}
    assert states == {"deleted"}


async def test_a_group_made_before_the_follow_up_waited_still_fans_in(
    schema: str, make_pg: Callable[..., Awaitable[PostgresBroker]]
) -> None:
    broker = await make_pg()

    async def downgrade(group_id: str) -> None:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET then_waiting = false WHERE id = %s").format(
                    sql.Identifier(schema, "groups")
                ),
                (group_id,),
            )

    await check_group_made_before_upgrade(broker, downgrade)
