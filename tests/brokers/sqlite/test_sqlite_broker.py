"""What only the SQLite broker promises: URLs, schema versions, file errors, its SQL, and
in-process wake-up latency. Behaviour shared with other brokers lives in tests/conformance."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from conformance.apps import check_group_made_before_upgrade
from durq.brokers import open_broker
from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.brokers.sqlfiles import parse_named
from durq.brokers.sqlite import SQLiteBroker
from durq.brokers.sqlite.admin import SEARCH_FUNCTION
from durq.brokers.sqlite.broker import SHORT_CALL_TASKS
from durq.brokers.sqlite.storage import MIGRATIONS, SCHEMA_VERSION, STATEMENTS, split_statements
from durq.clock import FakeClock
from durq.errors import BrokerUnavailableError, ConfigurationError, SchemaError


def task(task_id: str, queue: str = "default") -> EnqueueParams:
    return EnqueueParams(id=task_id, queue=queue, type="t", payload=b"{}")


def test_from_url_relative_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert SQLiteBroker.from_url("sqlite:///durq.sqlite3").path == str(tmp_path / "durq.sqlite3")
    assert SQLiteBroker.from_url("sqlite:///sub/x.db").path == str(tmp_path / "sub" / "x.db")
    assert SQLiteBroker.from_url("sqlite:////abs/x.db").path == "/abs/x.db"
    assert isinstance(open_broker("sqlite:////abs/x.db"), SQLiteBroker)


@pytest.mark.parametrize(
    "url",
    ["sqlite://host/x.db", "sqlite:///", "sqlite:///x.db?nope=1", "sqlite:///x.db?busy_timeout=x"],
)
def test_from_url_refuses_bad_urls(url: str) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteBroker.from_url(url)


async def test_connect_migrates_a_fresh_file(tmp_path: Path) -> None:
    broker = SQLiteBroker(str(tmp_path / "x.db"))
    await broker.connect()
    assert await broker.migrate() == [m.file for m in MIGRATIONS]  # applied on connect
    assert await broker.migrate() == []
    await broker.close()
    await broker.close()  # idempotent
    again = SQLiteBroker(str(tmp_path / "x.db"))
    assert await again.migrate() == []
    await again.close()


async def test_a_migration_filling_a_gap_is_applied_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two branches add migrations at once: the later number may be applied first (a gap),
    and the earlier one still is once it exists, as on PostgreSQL."""
    from durq.brokers import sqlfiles
    from durq.brokers.sqlite import storage

    top = SCHEMA_VERSION
    first = sqlfiles.Migration(top + 1, f"{top + 1:04d}_first.sql", "CREATE TABLE gap_a (x);")
    second = sqlfiles.Migration(top + 2, f"{top + 2:04d}_second.sql", "CREATE TABLE gap_b (x);")
    monkeypatch.setattr(storage, "SCHEMA_VERSION", top + 2)
    monkeypatch.setattr(storage, "MIGRATIONS", (*MIGRATIONS, second))
    broker = SQLiteBroker(str(tmp_path / "x.db"))
    assert (await broker.migrate())[-1] == second.file
    await broker.close()
    monkeypatch.setattr(storage, "MIGRATIONS", (*MIGRATIONS, first, second))
    again = SQLiteBroker(str(tmp_path / "x.db"))
    assert await again.migrate() == [first.file]
    await again.close()
    with sqlite3.connect(tmp_path / "x.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert {"gap_a", "gap_b"} <= tables


def test_migration_numbers_may_have_gaps_but_not_repeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durq.brokers import sqlfiles

    def package(name: str, *files: str) -> str:
        (tmp_path / name / "migrations").mkdir(parents=True)
        (tmp_path / name / "__init__.py").write_text("")
        for file in files:
            (tmp_path / name / "migrations" / file).write_text("SELECT 1;")
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    gap = sqlfiles.load_migrations(package("gap_pkg", "0001_a.sql", "0003_c.sql"))
    assert [m.version for m in gap] == [1, 3]
    with pytest.raises(ValueError, match="each number once"):
        sqlfiles.load_migrations(package("twice_pkg", "0001_a.sql", "0002_b.sql", "0002_c.sql"))
    with pytest.raises(ValueError, match="from 0001"):
        sqlfiles.load_migrations(package("late_pkg", "0002_b.sql"))


async def test_wal_mode_is_on(tmp_path: Path) -> None:
    broker = SQLiteBroker(str(tmp_path / "x.db"))
    await broker.connect()
    await broker.close()
    with sqlite3.connect(tmp_path / "x.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    broker = SQLiteBroker(str(path))
    await broker.connect()
    await broker.close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO durq_schema_migrations VALUES (?, 'future.sql', 0)", (SCHEMA_VERSION + 1,)
        )
    newer = SQLiteBroker(str(path))
    with pytest.raises(SchemaError, match="newer"):
        await newer.connect()
    with pytest.raises(SchemaError) as caught:
        await newer.migrate()
    assert caught.value.operation == "sqlite.migrate"
    await newer.close()


async def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database\n" * 200)
    broker = SQLiteBroker(str(path))
    with pytest.raises(BrokerUnavailableError) as caught:
        await broker.connect()
    assert "not a usable SQLite database" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.operation == "sqlite.connect"
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
    await broker.close()


async def test_unreachable_path_is_unavailable(tmp_path: Path) -> None:
    broker = SQLiteBroker(str(tmp_path / "missing-dir" / "x.db"))
    with pytest.raises(BrokerUnavailableError) as caught:
        await broker.enqueue(task("t"))
    assert caught.value.operation == "sqlite.enqueue"
    await broker.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
async def test_read_only_file_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    sqlite3.connect(path).close()
    path.chmod(0o444)
    broker = SQLiteBroker(str(path))
    with pytest.raises(BrokerUnavailableError):
        await broker.connect()
    await broker.close()


async def test_busy_lock_becomes_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    broker = SQLiteBroker(str(path), busy_timeout=0.1)
    await broker.connect()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    try:
        with pytest.raises(BrokerUnavailableError) as caught:
            await broker.enqueue(task("t"))
        assert caught.value.operation == "sqlite.enqueue"
        assert "locked" in str(caught.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await broker.enqueue(task("t"))  # nothing half-written: the id is free
    await broker.close()


async def test_a_claim_that_meets_a_lock_waits_off_the_event_loop(tmp_path: Path) -> None:
    """Claims and acks run on the loop's thread while the file is free; one that meets
    another connection's write lock must wait for it on the database thread, the loop
    turning meanwhile, and then claim what it would have claimed."""
    path = tmp_path / "x.db"
    broker = SQLiteBroker(str(path))
    await broker.connect()
    await broker.enqueue(task("t1"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing, for 0.5 s
    loop = asyncio.get_running_loop()
    loop.call_later(0.5, holder.execute, "COMMIT")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        leases = await broker.claim(ClaimParams(["default"], 5, "w", 30.0))
    finally:
        ticker.cancel()
        holder.close()
    assert [lease.task.id for lease in leases] == ["t1"]
    assert time.monotonic() - started >= 0.4  # it did wait for the lock
    assert ticks >= 10, f"the event loop turned {ticks} times in 0.5 s"
    assert await broker.complete(CompleteParams(leases[0].ref))  # back on the loop's thread
    await broker.close()


async def test_short_calls_run_on_the_callers_thread_only_when_the_connection_is_idle(
    tmp_path: Path,
) -> None:
    broker = SQLiteBroker(str(tmp_path / "x.db"))
    await broker.connect()
    here = threading.current_thread().name

    def where(conn: sqlite3.Connection) -> str:
        conn.execute("SELECT 1").fetchone()
        return threading.current_thread().name

    storage = broker._storage
    assert await storage.call("test", where, inline=True) == here
    assert await storage.call("test", where) != here  # not marked short: the database thread
    # While the database thread holds the connection, a short call queues behind it there.
    busy = asyncio.ensure_future(storage.call("test", lambda conn: time.sleep(0.3)))
    await asyncio.sleep(0.05)
    assert await storage.call("test", where, inline=True) != here
    await busy
    await broker.close()


def test_every_query_prepares_against_the_schema() -> None:
    conn = sqlite3.connect(":memory:")
    conn.create_function(SEARCH_FUNCTION, 2, lambda *_: 1)  # the admin registers it per search
    conn.execute(STATEMENTS["migrations_table"])
    for migration in MIGRATIONS:
        for statement in split_statements(migration.sql):
            conn.execute(statement)
    for name, sql in STATEMENTS.items():
        if sql.upper().startswith(("CREATE", "PRAGMA")):
            continue
        # EXPLAIN compiles without running.
        names = dict.fromkeys(re.findall(r":([a-z_]+)", sql))
        conn.execute(f"EXPLAIN {sql}", names)
        assert sql, name


def test_claim_uses_the_partial_index() -> None:
    conn = sqlite3.connect(":memory:")
    for migration in MIGRATIONS:
        for statement in split_statements(migration.sql):
            conn.execute(statement)
    query = STATEMENTS["claim_candidates"]
    names = dict.fromkeys(re.findall(r":([a-z_]+)", query))
    plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", names))
    assert "durq_tasks_claimable" in plan
    assert "TEMP B-TREE" not in plan  # the index order is the claim order
    # The claim's first step finds due scheduled/retry rows by range, not by a table scan.
    names = dict.fromkeys(re.findall(r":([a-z_]+)", STATEMENTS["promote_queue"]))
    plan = " ".join(
        row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {STATEMENTS['promote_queue']}", names)
    )
    assert "INDEX durq_tasks_state (queue=? AND state=? AND next_process_at<?)" in plan, plan
    # The idle check finds pending rows through the claim index too, past any held rows.
    names = dict.fromkeys(re.findall(r":([a-z_]+)", STATEMENTS["any_claimable"]))
    plan = " ".join(
        row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {STATEMENTS['any_claimable']}", names)
    )
    assert "INDEX durq_tasks_claimable (queue=?)" in plan, plan


async def test_priority_migration_keeps_existing_tasks_claimable_in_order(
    tmp_path: Path,
) -> None:
    """From the schema before priority with tasks in every waiting state: after migrating,
    each has priority 0 and the claim takes the due ones in due-time order."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(STATEMENTS["migrations_table"])
    (adding,) = [m for m in MIGRATIONS if m.label.endswith("_priority")]
    for migration in MIGRATIONS:
        if migration.version >= adding.version:
            break
        for statement in split_statements(migration.sql):
            conn.execute(statement)
        conn.execute(
            STATEMENTS["record_migration"],
            {"version": migration.version, "name": "old", "now": 0.0},
        )
    t0 = 1_800_000_000.0
    for task_id, state, at in [
        ("late", "pending", t0 + 1),
        ("early", "pending", t0),
        ("due-scheduled", "scheduled", t0 + 0.5),
        ("future-retry", "retry", t0 + 3600),
    ]:
        conn.execute(
            "INSERT INTO durq_tasks (id, queue, type, payload, state, max_retry, "
            "next_process_at, enqueued_at) VALUES (?, 'default', 't', ?, ?, 3, ?, ?)",
            (task_id, b"{}", state, at, t0),
        )
    conn.commit()
    conn.close()

    broker = SQLiteBroker(str(path), clock=FakeClock(t0 + 10))
    try:
        assert adding.file in await broker.migrate()
        await broker.connect()
        got = await broker.claim(ClaimParams(["default"], 10, "w", 30.0))
        assert [lease.task.id for lease in got] == ["early", "due-scheduled", "late"]
        assert {lease.task.priority for lease in got} == {0}
        assert (await broker.admin.get_task("default", "future-retry")).priority == 0
    finally:
        await broker.close()


def test_named_sql_parser() -> None:
    text = "-- name: a\n-- a comment\nSELECT 1;\n\n-- name: b\nSELECT\n  2;\n"
    assert parse_named(text) == {"a": "SELECT 1", "b": "SELECT\n  2"}
    with pytest.raises(ValueError, match="twice"):
        parse_named("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_schema_checks_states_and_names(tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:")
    for migration in MIGRATIONS:
        for statement in split_statements(migration.sql):
            conn.execute(statement)
    insert = (
        "INSERT INTO durq_tasks (id, queue, type, payload, state, max_retry, next_process_at, "
        "enqueued_at) VALUES (?, ?, 't', x'7b7d', ?, 0, 0, 0)"
    )
    conn.execute(insert, ("ok", "a:b-c.d_e", "pending"))
    for bad in [("x", "q", "running"), ("y", "bad queue", "pending"), ("z", "q'", "pending")]:
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(insert, bad)


async def test_in_process_wakeup_is_fast(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    # A slow poll interval proves the in-process registry, not polling, does the waking.
    waiter = SQLiteBroker.from_url(url + "?poll_interval=5", clock=FakeClock())
    client = SQLiteBroker.from_url(url, clock=FakeClock())
    await waiter.connect()
    await client.connect()
    took = []
    for i in range(5):
        wait = asyncio.create_task(waiter.wait_for_work(["default"], timeout=10))
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        await client.enqueue(task(f"t{i}"))
        assert await asyncio.wait_for(wait, 2)
        took.append(time.perf_counter() - start)
    assert sorted(took)[2] < 0.05, took
    await waiter.close()
    await client.close()


async def test_claim_after_close_reopens(tmp_path: Path) -> None:
    broker = SQLiteBroker(str(tmp_path / "x.db"), clock=FakeClock())
    await broker.enqueue(task("t"))
    await broker.close()
    got = await broker.claim(ClaimParams(["default"], 5, "w", 30))
    assert [lease.task.id for lease in got] == ["t"]
    await broker.close()


async def test_the_wal_is_checkpointed_in_the_background(tmp_path: Path) -> None:
    """Commits wake a checkpoint on another thread: the log's frames reach the database file
    without any caller checkpointing, and close() ends that thread."""
    # Only this broker's thread counts: brokers other tests left open have their own.
    before = {t for t in threading.enumerate() if t.name == "durq-sqlite-checkpoint"}
    broker = SQLiteBroker(str(tmp_path / "q.db"))
    await broker.connect()
    for i in range(20):
        await broker.enqueue(task(f"t{i}"))
    checkpointer = broker._storage.checkpointer

    def in_the_file() -> int:
        """Tasks another connection sees reading only the database file (no WAL)."""
        copy = sqlite3.connect(f"file:{tmp_path / 'q.db'}?immutable=1", uri=True)
        try:
            return int(copy.execute("SELECT count(*) FROM durq_tasks").fetchone()[0])
        except sqlite3.Error:
            return -1  # read while a checkpoint writes the file: not there yet
        finally:
            copy.close()

    # A checkpoint that ran after the 17th commit is complete too: wait for all 20 in the file.
    deadline = time.monotonic() + 10
    while (
        checkpointer.last is None
        or checkpointer.last[2] < checkpointer.last[1]
        or in_the_file() != 20
    ) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert checkpointer.last is not None
    busy, frames, copied = checkpointer.last
    assert busy == 0 and frames > 0 and copied == frames
    assert in_the_file() == 20
    await broker.close()
    assert not [
        t for t in threading.enumerate() if t.name == "durq-sqlite-checkpoint" and t not in before
    ]


async def test_claims_of_many_tasks_go_to_the_database_thread(tmp_path: Path) -> None:
    """A claim or ack of a few tasks runs on the caller's thread; one of more than
    ``SHORT_CALL_TASKS`` would hold the event loop for its whole SQL, so it does not."""
    broker = SQLiteBroker(str(tmp_path / "x.db"))
    await broker.connect()
    many = SHORT_CALL_TASKS + 1
    await broker.enqueue_many([task(f"t{i}") for i in range(many + 1)])
    threads: set[str] = set()
    conn = broker._storage._conn
    assert conn is not None
    conn.set_trace_callback(lambda _: threads.add(threading.current_thread().name))
    here = threading.current_thread().name

    one = await broker.claim(ClaimParams(["default"], 1, "w", 30.0))
    assert threads == {here}
    threads.clear()
    rest = await broker.claim(ClaimParams(["default"], many, "w", 30.0))
    assert len(rest) == many and here not in threads
    threads.clear()
    assert all(await broker.complete_many([CompleteParams(lease.ref) for lease in rest]))
    assert here not in threads
    threads.clear()
    assert await broker.complete(CompleteParams(one[0].ref))
    assert threads == {here}
    await broker.close()


async def test_a_group_made_before_the_follow_up_waited_still_fans_in(tmp_path: Path) -> None:
    broker = SQLiteBroker(str(tmp_path / "x.db"))

    async def downgrade(group_id: str) -> None:
        with sqlite3.connect(broker.path) as conn:
            conn.execute("UPDATE durq_groups SET then_waiting = 0 WHERE id = ?", (group_id,))

    try:
        await check_group_made_before_upgrade(broker, downgrade)
    finally:
        await broker.close()
