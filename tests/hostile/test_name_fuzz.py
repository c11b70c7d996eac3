"""Queue names, task types and task ids fuzzed with hypothesis on every broker (S3).

Each name is either refused with :class:`InvalidNameError` or round-trips exactly; nothing
changes the SQL catalog (no table created or dropped, in our schema or elsewhere) and every
Redis key stays under the broker's prefix. The client checks names at the edge; the same
names are also sent to the broker directly (as a buggy or hostile client would), where the
storage's own checks must hold."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durq
from durq import groups, names
from durq.brokers import FullBroker, open_broker
from durq.brokers.base import EnqueueParams
from durq.errors import DurqError, InvalidNameError, TaskNotFoundError
from durq.states import TaskState
from servers import PG_DSN, PrivateRedis, drop_isolated, require_server, unique_name

NASTY = [*list("'\";-{}*?[]\\ \t\n\r\x00%_:.$`|&/<>@+=#,()!~^"), "é", "日", "🙂", "\u202e", "ß"]
SAMPLES = [
    "'; DROP TABLE tasks; --",
    "x'); DELETE FROM durq_tasks; --",
    "a--b",
    "q;",
    "{q}",
    "a{b}c",
    "*",
    "a*",
    "q\x00",
    "\x00",
    "a" * 100,
    "a" * 101,
    "a" * 10_000,
    "durq:{other}:t:x",
    "..",
    "-lead",
    "default",
    "ok.name:with-parts_1",
    "Ünïcödé",
    "",
]
name_strategy = st.one_of(
    st.sampled_from(SAMPLES),
    st.text(alphabet=st.sampled_from(NASTY + list("aZ09")), min_size=0, max_size=24),
    st.text(min_size=0, max_size=40),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,30}", fullmatch=True),
)


def fuzz_names(test: Callable[[str, str, str], None]) -> Callable[[], None]:
    """``@settings`` + ``@given``: both sides of the test draw the same names, same budget."""
    budget = settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    draw: Callable[[], None] = given(
        queue=name_strategy, type_=name_strategy, task_id=name_strategy
    )(test)
    return budget(draw)


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def fuzz_target(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, str, object]]:
    """(kind, url, private) — Redis runs on a private server so that *every* key is ours."""
    kind = str(request.param)
    if kind == "sqlite":
        yield kind, f"sqlite:///{tmp_path / 'fuzz.sqlite3'}", None
    elif kind == "postgres":
        require_server("postgres")
        url = f"{PG_DSN}?schema={unique_name('durq_fuzz')}"
        yield kind, url, None
        drop_isolated("postgres", url)
    else:
        try:
            server = PrivateRedis(tmp_path / "redis")
        except RuntimeError as exc:
            pytest.skip(str(exc))
        try:
            yield kind, f"{server.url}?prefix=fuzz", server
        finally:
            server.close()


def catalog(kind: str, url: str, server: object) -> object:
    """Everything an injection could change outside our rows."""
    if kind == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return sorted(conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall())
    if kind == "postgres":
        import psycopg

        schema = url.split("schema=", 1)[1]
        with psycopg.connect(PG_DSN) as conn:
            ours = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "ORDER BY 1",
                (schema,),
            ).fetchall()
            public = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                "ORDER BY 1"
            ).fetchall()
            return ours, public
    import redis

    assert isinstance(server, PrivateRedis)
    client = redis.Redis(port=server.port)
    try:
        keys = [k.decode("utf-8", "replace") for k in client.scan_iter(count=1000)]
    finally:
        client.close()
    return sorted(keys)


class Loop:
    """One event loop for all examples of a test (hypothesis calls a sync function)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()


def valid(name: str) -> bool:
    try:
        names.check_queue(name)
    except InvalidNameError:
        return False
    return True


def valid_id(task_id: str) -> bool:
    try:
        names.check_task_id(task_id)
    except InvalidNameError:
        return False
    return True


@pytest.mark.timeout(240)
def test_names_refused_or_round_trip(fuzz_target: tuple[str, str, object]) -> None:
    kind, url, server = fuzz_target
    loop = Loop()
    app = durq.App(url)
    broker: FullBroker = open_broker(url)
    loop.run(broker.migrate())
    loop.run(broker.connect())
    loop.run(app.enqueue("fuzz:seed", {}, queue="seed"))  # every table/key family exists
    before = catalog(kind, url, server)
    seen: set[tuple[str, str]] = set()

    @fuzz_names
    def client_side(queue: str, type_: str, task_id: str) -> None:
        expected_ok = valid(queue) and valid(type_) and valid_id(task_id)
        if (queue, task_id) in seen:
            return
        try:
            info = loop.run(app.enqueue(type_, {"q": queue}, queue=queue, task_id=task_id))
        except InvalidNameError:
            assert not expected_ok
            return
        assert expected_ok, (queue, type_, task_id)
        seen.add((queue, task_id))
        assert (info.queue, info.type, info.id) == (queue, type_, task_id)
        got = loop.run(app.inspector.get_task_info(queue, task_id))
        assert (got.queue, got.type, got.id, got.payload) == (queue, type_, task_id, {"q": queue})

    @fuzz_names
    def broker_side(queue: str, type_: str, task_id: str) -> None:
        """Past the client's checks: the broker refuses with a durq error or round-trips."""
        if (queue, task_id) in seen:
            return
        params = EnqueueParams(id=task_id, queue=queue, type=type_, payload=b"{}")
        try:
            info = loop.run(broker.enqueue(params))
        except DurqError:
            pass  # InvalidNameError, or the storage's CHECK reported as a durq error
        else:
            seen.add((queue, task_id))
            assert (info.queue, info.type, info.id) == (queue, type_, task_id)
            try:
                got = loop.run(broker.admin.get_task(queue, task_id))
            except (InvalidNameError, TaskNotFoundError) as exc:
                raise AssertionError(f"stored but not readable: {queue!r} {task_id!r}") from exc
            assert (got.queue, got.type, got.id) == (queue, type_, task_id)
        for call in (broker.admin.queue_stats(queue), broker.admin.pause_queue(queue)):
            try:
                loop.run(call)
            except DurqError:
                pass

    try:
        client_side()
        broker_side()
        after = catalog(kind, url, server)
    finally:
        loop.run(broker.close())
        loop.run(app.close())
        loop.close()
    if kind == "redis":
        assert all(k.startswith("fuzz:") for k in after), [
            k for k in after if not k.startswith("fuzz:")
        ]
    else:
        assert after == before


@pytest.mark.timeout(240)
async def test_a_group_of_the_maximum_with_the_longest_names(
    fuzz_target: tuple[str, str, object],
) -> None:
    """The largest group with the longest valid names (group id, queue, type, every task
    id): created whole, released by one bulk delete into one follow-up that names every
    member, and nothing written outside our tables or our key prefix."""
    kind, url, server = fuzz_target
    app = durq.App(url)
    try:
        migrator = app.new_broker()
        await migrator.migrate()
        await migrator.close()
        broker = await app.broker()
        queue, member_type = "q" * names.NAME_MAX, "t" * names.NAME_MAX
        await app.enqueue(member_type, {}, queue=queue)  # every table/key family exists
        before = catalog(kind, url, server)
        ids = [f"{i:05d}-".ljust(names.TASK_ID_MAX, "/") for i in range(groups.MAX_MEMBERS)]
        members = [
            app.params(durq.EnqueueRequest(member_type, {}, queue=queue, task_id=i, process_in=60))
            for i in ids
        ]
        then = durq.Then(member_type, queue=queue)
        group_id = "g" * names.NAME_MAX
        await broker.enqueue_group(
            groups.build(group_id, members, then, app, retention=60, max_payload=app.max_payload)
        )
        deleted = await app.inspector.delete_all(queue, TaskState.SCHEDULED)
        assert deleted == groups.MAX_MEMBERS
        follow = await app.inspector.get_task_info(queue, groups.follow_up_id(group_id))
        assert [m["id"] for m in follow.payload["members"]] == ids
        after = catalog(kind, url, server)
    finally:
        await app.close()
    if kind == "redis":
        assert all(k.startswith("fuzz:") for k in after), [
            k for k in after if not k.startswith("fuzz:")
        ]
    else:
        assert after == before
