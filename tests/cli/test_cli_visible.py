"""``durq queue partitions`` and ``durq queue unique`` through a real subprocess: the
partitions of a queue's fair limits, and the unique keys its tasks hold (debounced tasks
with when they run at the latest), as tables and as --json."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.cli.clikit import Cli

import durq
from durq.brokers.base import ClaimParams

TENANT = durq.Limit("tenant:{tenant}", concurrency=10, fair=True)
DEBOUNCE = durq.Debounce("account", wait=30, max_wait=120)


def _setup(cli: Cli) -> None:
    """Tenant a: 3 tasks, one of them running; b: 1; c: 2; in queue ``crm`` a debounced
    sync enqueued twice (one task) and a task unique by ttl."""
    app = durq.App(cli.url)

    async def fill() -> None:
        for tenant, n in (("a", 3), ("b", 1), ("c", 2)):
            for i in range(n):
                await app.enqueue("report", {"tenant": tenant, "i": i}, limit=TENANT)
        broker = await app.broker()
        (lease,) = await broker.claim(ClaimParams(["default"], 1, "w-test", 60))
        assert lease.task.payload["tenant"] == "a"
        await app.enqueue("crm:sync", {"account": 7, "edit": 1}, queue="crm", unique=DEBOUNCE)
        await app.enqueue("crm:sync", {"account": 7, "edit": 2}, queue="crm", unique=DEBOUNCE)
        await app.enqueue("crm:mail", {"to": "x"}, queue="crm", unique=3600, process_in=600)

    try:
        app.run_sync(fill)
    finally:
        app.close_sync()


def test_queue_partitions_and_unique(cli: Cli) -> None:
    _setup(cli)
    seen = cli.ok("queue", "partitions", "default", "--top", "2", "--json").json()
    assert seen["templates"] == [
        {"template": "tenant:{tenant}", "key": "", "pending": 5, "running": 1, "partitions": 3}
    ]
    assert [(p["key"], p["pending"], p["running"]) for p in seen["top"]] == [
        ("tenant:a", 2, 1),
        ("tenant:c", 2, 0),
    ]
    assert seen["others"] == {
        "template": "",
        "key": "",
        "pending": 1,
        "running": 0,
        "partitions": 1,
    }
    table = cli.ok("queue", "partitions", "default", "--top", "2").out
    assert "tenant:{tenant}" in table and "tenant:a" in table and "1 other partition(s)" in table
    assert "tenant:b" not in table

    held = cli.ok("queue", "unique", "crm", "--json").json()
    assert held["total"] == 2 and held["complete"] is True
    sync, mail = held["entries"]  # the sync is due first (30 s against 600 s)
    assert (sync["type"], sync["state"], sync["debounced"]) == ("crm:sync", "scheduled", True)
    assert (sync["wait"], sync["max_wait"]) == (30.0, 120.0)
    due, latest = datetime.fromisoformat(sync["due"]), datetime.fromisoformat(sync["latest"])
    assert timedelta(seconds=60) < latest - due <= timedelta(seconds=90)
    assert (mail["type"], mail["debounced"], mail["latest"]) == ("crm:mail", False, None)
    table = cli.ok("queue", "unique", "crm").out
    assert "crm:sync" in table and "30s / max 120s" in table and "2 of 2" in table

    assert "no task of default holds a unique key now" in cli.ok("queue", "unique", "default").out
    assert "no task of crm waits or runs" in cli.ok("queue", "partitions", "crm").out


def test_queue_partitions_and_unique_errors(cli: Cli) -> None:
    _setup(cli)
    assert cli("queue", "partitions", "nowhere").code == 1
    assert cli("queue", "unique", "nowhere").code == 1
    assert cli("queue", "partitions", "default", "--top", "0").code == 2
    assert cli("queue", "unique", "crm", "--limit", "5000").code == 2
