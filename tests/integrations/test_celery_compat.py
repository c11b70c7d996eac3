"""durq.contrib.celery: Celery's task API over durq, run by durq's own worker."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import durq
import durq.testing
from durq.clock import FakeClock
from durq.contrib.celery import (
    Celery,
    MaxRetriesExceededError,
    Task,
    crontab,
    shared_task,
)
from durq.errors import ConfigurationError
from durq.states import TaskState

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def durq_app(tmp_path: Path) -> AsyncIterator[durq.App]:
    app = durq.App(f"sqlite:///{tmp_path / 'celery.sqlite3'}", clock=FakeClock(1_800_000_000))
    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    yield app
    await app.close()


@pytest.fixture(autouse=True)
def no_shared_tasks_left() -> Iterator[None]:
    from durq.contrib import celery

    before = list(celery._shared)
    yield
    celery._shared[:] = before


async def test_delay_runs_the_function_with_its_arguments_and_returns_the_result(
    durq_app: durq.App,
) -> None:
    app = Celery("proj", app=durq_app)

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="proj.greet", queue="mail")
    def greet(name: str, *, punctuation: str = ".") -> str:
        return f"hello {name}{punctuation}"

    assert add.name == f"{__name__}.add"
    assert add(2, 3) == 5  # calling runs it here, as in Celery
    async with durq.testing.worker(durq_app) as w:
        first = await add.adelay(16, 16)
        second = await greet.aapply_async(("ann",), {"punctuation": "!"})
        ran = await w.drain()
        assert sorted(map(str, (a.result for a in ran))) == ["32", "hello ann!"]
        info = await w.get(second.id, queue="mail")
        assert info.queue == "mail" and info.type == "proj.greet"
        assert info.payload == {"args": ["ann"], "kwargs": {"punctuation": "!"}}
        assert (await w.get(first.id)).result == 32


async def test_apply_async_options_map_to_durq_options(durq_app: durq.App) -> None:
    app = Celery("proj", app=durq_app)

    @app.task(priority=5)
    def job() -> str:
        return "done"

    async with durq.testing.worker(durq_app) as w:
        now = datetime.fromtimestamp(w.clock.now(), UTC)
        later = await job.aapply_async(countdown=60, task_id="order-7", queue="slow")
        assert later.id == "order-7"
        info = await w.get("order-7", queue="slow")
        assert info.state is TaskState.SCHEDULED
        assert info.priority == 5
        assert info.next_process_at is not None
        assert abs(info.next_process_at.timestamp() - (now.timestamp() + 60)) < 1
        at = await job.aapply_async(eta=now + timedelta(hours=1), priority=-3)
        at_info = await w.get(at.id)
        assert at_info.priority == -3 and at_info.state is TaskState.SCHEDULED
        expiring = await job.aapply_async(expires=now + timedelta(minutes=5))
        assert (await w.get(expiring.id)).deadline is not None
        with pytest.raises(TypeError, match="link"):
            await job.aapply_async(link=job.s())
        with pytest.raises(TypeError, match="list or tuple"):
            await job.aapply_async("abc")


async def test_self_retry_waits_its_countdown_and_gives_up_with_the_error(
    durq_app: durq.App,
) -> None:
    app = Celery("proj", app=durq_app)
    seen: list[tuple[int, str]] = []

    @app.task(bind=True, max_retries=2)
    def poll(self: Task, order: str) -> str:
        seen.append((self.request.retries, self.request.id))
        raise self.retry(exc=LookupError(f"{order} not ready"), countdown=30)

    async with durq.testing.worker(durq_app) as w:
        handle = await poll.adelay("o-1")
        assert (await w.drain()).outcomes == [(poll.name, "retry")]
        w.clock.advance(29)
        assert await w.drain() == []
        w.clock.advance(1)
        assert (await w.drain()).outcomes == [(poll.name, "retry")]
        w.clock.advance(30)
        last = await w.drain(raise_errors=False)
        assert last.outcomes == [(poll.name, "archived")]
        info = await w.get(handle.id)
        assert info.last_error == "LookupError: o-1 not ready"
        assert [r for r, _ in seen] == [0, 1, 2]
        assert {i for _, i in seen} == {handle.id}


async def test_max_retries_exceeded_without_an_exception_fails_with_its_own_error(
    durq_app: durq.App,
) -> None:
    app = Celery("proj", app=durq_app)

    @app.task(bind=True, max_retries=0)
    def once(self: Task) -> None:
        raise self.retry()

    async with durq.testing.worker(durq_app) as w:
        handle = await once.adelay()
        ran = await w.drain(raise_errors=False)
        assert ran.outcomes == [(once.name, "archived")]
        assert isinstance(ran[0].error, durq.SkipRetry)
        assert (await w.get(handle.id)).last_error.startswith("MaxRetriesExceededError")
        assert MaxRetriesExceededError.__name__ in (await w.get(handle.id)).last_error


async def test_an_exception_fails_at_once_and_logs_the_alert(
    durq_app: durq.App, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("proj", app=durq_app)

    @app.task
    def boom(n: int) -> None:
        raise ValueError(f"bad {n}")

    caplog.set_level(logging.INFO, logger="durq")
    async with durq.testing.worker(durq_app) as w:
        handle = await boom.adelay(3)
        ran = await w.drain(raise_errors=False)
        assert ran.outcomes == [(boom.name, "archived")]
        info = await w.get(handle.id)
        assert info.attempts == 1
        assert info.last_error == "ValueError: bad 3"
        assert info.traceback is not None and "ValueError: bad 3" in info.traceback
    alerts = [r for r in caplog.records if r.levelno == logging.ERROR and "archived" in r.message]
    assert len(alerts) == 1 and handle.id in alerts[0].getMessage()


async def test_autoretry_for_retries_with_backoff_then_fails(durq_app: durq.App) -> None:
    app = Celery("proj", app=durq_app)
    calls: list[int] = []

    @app.task(
        autoretry_for=(ConnectionError,),
        retry_backoff=10,
        retry_jitter=False,
        retry_kwargs={"max_retries": 2},
    )
    def flaky() -> None:
        calls.append(1)
        raise ConnectionError("partner down")

    async with durq.testing.worker(durq_app) as w:
        handle = await flaky.adelay()
        assert (await w.drain(raise_errors=False)).outcomes == [(flaky.name, "retry")]
        w.clock.advance(9)  # 10 * 2**0
        assert await w.drain() == []
        w.clock.advance(1)
        assert (await w.drain(raise_errors=False)).outcomes == [(flaky.name, "retry")]
        w.clock.advance(19)  # 10 * 2**1
        assert await w.drain() == []
        w.clock.advance(1)
        assert (await w.drain(raise_errors=False)).outcomes == [(flaky.name, "archived")]
        assert (await w.get(handle.id)).last_error == "ConnectionError: partner down"
    assert len(calls) == 3


async def test_shared_tasks_join_the_app_and_periodic_entries_become_schedules(
    durq_app: durq.App,
) -> None:
    @shared_task
    def ping() -> str:
        return "pong"

    @shared_task(name="reports.nightly")
    def nightly(kind: str) -> str:
        return kind

    app = Celery("proj", app=durq_app)
    app.conf.beat_schedule = {
        "nightly report": {
            "task": "reports.nightly",
            "schedule": crontab(minute=30, hour=2),
            "args": ("sales",),
        }
    }

    @app.on_after_configure.connect
    def setup(sender: Celery, **_: Any) -> None:
        sender.add_periodic_task(10.0, ping.s(), name="ping every 10")

    assert app.durq_app is durq_app
    entries = {e.name: e for e in durq_app.schedules}
    assert set(entries) == {"nightly-report", "ping-every-10"}
    assert entries["nightly-report"].type == "reports.nightly"
    assert entries["nightly-report"].payload == {"args": ["sales"], "kwargs": {}}
    assert entries["ping-every-10"].schedule.spec == "@every 10s"
    async with durq.testing.worker(durq_app) as w:
        handle = await ping.adelay()
        assert (await w.drain()).of(ping.name)[0].result == "pong"
        assert (await w.get(handle.id)).state is TaskState.COMPLETED


def test_celery_crontab_objects_and_intervals_are_read() -> None:
    class CeleryCrontab:  # the attributes celery.schedules.crontab keeps
        _orig_minute, _orig_hour, _orig_day_of_week = "*/15", "9-17", "mon-fri"
        _orig_day_of_month, _orig_month_of_year = "*", "*"

    from durq.contrib.celery import _schedule_text

    assert _schedule_text(CeleryCrontab()) == "*/15 9-17 * * mon-fri"
    assert _schedule_text(timedelta(minutes=5)) == "@every 300s"
    with pytest.raises(ConfigurationError, match="whole number"):
        _schedule_text(0.5)


def test_a_broker_durq_does_not_have_is_refused_with_the_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DURQ_BROKER_URL", raising=False)
    app = Celery("proj", broker="amqp://guest@localhost//")
    with pytest.raises(ConfigurationError, match=r"no 'amqp' broker.*DURQ_BROKER_URL"):
        _ = app.durq_app
    with pytest.raises(ConfigurationError, match=r"does not take.*base"):
        app.task(base=object)(lambda: None)


def test_a_shared_task_without_an_app_says_so() -> None:
    from durq.contrib import celery

    @shared_task
    def lonely() -> None:
        return None

    saved = celery.Celery._current
    celery.Celery._current = None
    try:
        with pytest.raises(ConfigurationError, match="has no app"):
            lonely.delay()
    finally:
        celery.Celery._current = saved


# -- the whole road: a Celery-style module, durq's worker process, .delay().get() -----------

PROJECT = """
    from durq.contrib.celery import Celery, shared_task

    app = Celery("shop", include=["shop_tasks"])
    app.conf.update(task_default_queue="shop")
"""

TASKS = """
    from durq.contrib.celery import shared_task
    from shop_app import app

    @app.task
    def add(x, y):
        return x + y

    @shared_task(bind=True, max_retries=3)
    def twice(self, word):
        if self.request.retries == 0:
            raise self.retry(countdown=0.2)
        return f"{word}:{self.request.retries}"
"""


def test_a_celery_style_project_runs_on_durq_worker(tmp_path: Path) -> None:
    (tmp_path / "shop_app.py").write_text(textwrap.dedent(PROJECT))
    (tmp_path / "shop_tasks.py").write_text(textwrap.dedent(TASKS))
    env = {
        **os.environ,
        "DURQ_BROKER_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")]),
    }
    durq_bin = Path(sys.executable).with_name("durq")
    subprocess.run(
        [str(durq_bin), "migrate"], cwd=tmp_path, env=env, check=True, capture_output=True
    )
    worker = subprocess.Popen(
        [str(durq_bin), "worker", "shop_app:app", "--concurrency", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        client = subprocess.run(
            [
                sys.executable,
                "-c",
                "import shop_app, shop_tasks;"
                "a = shop_tasks.add.delay(16, 16); t = shop_tasks.twice.delay('hi');"
                "print(a.get(timeout=60), t.get(timeout=60), a.state, a.successful())",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert client.returncode == 0, client.stderr
        assert client.stdout.split() == ["32", "hi:1", "SUCCESS", "True"]
    finally:
        worker.terminate()
        try:
            _, err = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert worker.returncode == 0, err.decode()[-2000:]


def test_async_result_reports_states(tmp_path: Path) -> None:
    app = Celery("proj", broker=f"sqlite:///{tmp_path / 'r.sqlite3'}")

    @app.task
    def slow() -> int:
        return 1

    app.durq_app.run_sync(lambda: _migrate(app.durq_app))
    handle = slow.apply_async(countdown=3600)
    assert handle.state == "PENDING" and not handle.ready() and handle.result is None
    assert app.AsyncResult("no-such-task").state == "PENDING"
    with pytest.raises(durq.WaitTimeoutError):
        handle.get(timeout=0.1)
    app.durq_app.close_sync()


async def _migrate(app: durq.App) -> None:
    broker = app.new_broker()
    await broker.migrate()
    await broker.close()
