"""The dashboard in a real browser (Debian's Chromium, headless) over uvicorn on loopback,
with a real SQLite broker and a worker running: log in, list queues, open a task, retry an
archived task and see it run, pause a queue, and be refused without credentials.

Screenshots go to ``test-artifacts/`` (not committed). Without ``/usr/bin/chromium`` the
tests skip, except under ``CI=true`` where that is a failure."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import durq
from durq.dashboard import DashboardSettings, create_dashboard
from durq.inspector import Inspector

from .conftest import TOKEN
from .live import LiveServer

T = TypeVar("T")
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
IN_CI = os.environ.get("CI", "").lower() == "true"


def _require_browser() -> Any:
    reason = None
    if not Path(CHROMIUM).exists():
        reason = f"{CHROMIUM} is missing (apt-get install chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = reason or "playwright is not installed (pip install -e '.[dev]')"
        sync_playwright = None
    if reason is not None:
        if IN_CI:
            pytest.fail(f"browser tests cannot run: {reason} (required when CI=true)")
        pytest.skip(reason)
    return sync_playwright


def run_async(main: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a fresh loop in a thread: Playwright's sync API owns this thread's."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(main())).result()  # type: ignore[arg-type]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


class WorkerThread:
    """A durq worker on its own event loop, like ``durq worker`` next to the dashboard."""

    def __init__(self, app: durq.App) -> None:
        self.app = app
        self.started = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        async with self.app.worker(concurrency=2, poll_interval=0.1, promote_interval=0.2):
            self.started.set()
            while not self.stopping.is_set():
                await asyncio.sleep(0.05)
        await self.app.close()

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        assert self.started.wait(10), "worker did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(15)


@dataclass
class Env:
    app: durq.App
    url: str
    attempts: list[int]
    #: Steps of the ``import:rows`` handler: it waits on each in turn.
    gates: tuple[threading.Event, threading.Event]

    def call(self, make: Callable[[Inspector], Awaitable[T]]) -> T:
        """Ask the inspector from a fresh loop in a thread (Playwright owns this thread's)."""

        async def main() -> T:
            try:
                return await make(self.app.inspector)
            finally:
                await self.app.close()

        return run_async(main)

    def state(self, queue: str, task_id: str) -> str:
        async def get(inspector: Inspector) -> str:
            return (await inspector.get_task_info(queue, task_id)).state.value

        return self.call(get)

    def paused(self, queue: str) -> bool:
        async def get(inspector: Inspector) -> bool:
            return (await inspector.queue_stats(queue)).paused

        return self.call(get)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    attempts: list[int] = []

    @app.task("email:send", queue="default", retention=3600)
    async def send(payload: dict) -> dict:
        return {"sent_to": payload.get("to")}

    @app.task("report:build", queue="reports", max_retry=0, retention=3600)
    def build(payload: dict) -> dict:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("partner API timed out")
        return {"pages": 3}

    gates = (threading.Event(), threading.Event())

    @app.task("import:rows", queue="reports", retention=3600)
    def import_rows(payload: dict, ctx: durq.TaskContext) -> None:
        ctx.log("started")
        ctx.progress(0.4, "rows 400/1000")
        gates[0].wait(30)
        ctx.log("slow row 17", level="warning")
        ctx.progress(0.8, "rows 800/1000")
        gates[1].wait(30)

    # A schedule that does not tick during a test (New Year's midnight, UTC).
    app.add_periodic("0 0 1 1 *", "email:send", name="mail:new-year", payload={"to": "all"})

    async def seed() -> None:
        await (await app.broker()).migrate()
        await app.enqueue("report:build", {"month": "2024-05"}, task_id="report-may")
        for i in range(3):
            await app.enqueue("email:send", {"to": f"user{i}@example.com"}, process_in=3600)
        await app.close()

    run_async(seed)
    settings = DashboardSettings(refresh_seconds=2)
    with LiveServer(create_dashboard(app, token=TOKEN, settings=settings)) as server:
        with WorkerThread(app):
            e = Env(app, server.url, attempts, gates)
            wait_for(lambda: e.state("reports", "report-may") == "archived")
            try:
                yield e
            finally:
                for gate in gates:  # a failed test must not leave the handler waiting
                    gate.set()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _require_browser()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, env: Env) -> Iterator[Any]:
    """A fresh browser context (no cookies) per test."""
    yield from fresh_page(browser)


def fresh_page(browser: Any) -> Iterator[Any]:
    """A page in a new context; at the end, no script error or CSP violation was logged."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("dialog", lambda d: d.accept())  # every action asks for confirmation
    yield pg
    context.close()
    # CSP violations and script errors show up on the console (pages answered with 4xx on
    # purpose show up too, as "Failed to load resource")
    assert not [e for e in errors if "Failed to load resource" not in e], errors


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def log_in(page: Any, env: Env | LimitsEnv) -> None:
    page.goto(env.url + "/")
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(env.url + "/")


def test_refuses_access_without_credentials(page: Any, env: Env) -> None:
    response = page.request.get(env.url + "/api/queues")
    assert response.status == 401
    page.goto(env.url + "/queues/reports")
    assert "/login" in page.url
    shot(page, "login")
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    assert page.locator(".error").inner_text() == "wrong token"
    page.goto(env.url + "/workers")
    assert "/login" in page.url


def test_lists_queues_and_draws_the_chart(page: Any, env: Env) -> None:
    log_in(page, env)
    rows = page.locator("table#queues tbody tr")
    names = sorted(rows.nth(i).get_attribute("data-queue") for i in range(rows.count()))
    assert names == ["default", "reports"]
    assert page.locator('tr[data-queue="default"] [data-field="scheduled"]').inner_text() == "3"
    page.wait_for_selector("#chart svg polyline.line-ok", state="attached")
    shot(page, "overview")
    page.set_viewport_size({"width": 390, "height": 800})
    shot(page, "overview-mobile")


def test_retry_an_archived_task_and_see_it_run(page: Any, env: Env) -> None:
    log_in(page, env)
    page.click('a[href="/queues/reports"]')
    page.click('.tabs a[data-state="archived"]')
    page.click("text=report-may")
    assert page.locator("#task-state").text_content() == "archived"
    assert "partner API timed out" in page.locator("#last-error").inner_text()
    assert '"month": "2024-05"' in page.locator("#payload").inner_text()
    shot(page, "task-archived")
    page.click("#action-run")  # confirmed by the dialog handler
    assert "queued to run now" in page.locator(".notice").inner_text()
    wait_for(lambda: env.state("reports", "report-may") == "completed")
    page.reload()
    assert page.locator("#task-state").text_content() == "completed"
    assert '"pages": 3' in page.locator("#result").inner_text()
    assert len(env.attempts) == 2
    shot(page, "task-completed")


def test_pause_a_queue_and_see_workers(page: Any, env: Env) -> None:
    log_in(page, env)
    page.goto(env.url + "/queues/default?state=scheduled")
    assert page.locator("table.tasks tbody tr").count() == 3
    page.click("#pause")
    assert "paused" in page.locator(".notice").inner_text()
    assert page.locator(".crumbs .badge.paused").is_visible()
    assert env.paused("default")
    shot(page, "queue-paused")
    page.fill("form.search input[name=id]", "no-such-task")
    page.click("form.search button")
    assert "404" in page.locator("h1").inner_text()
    page.goto(env.url + "/workers")
    assert page.locator("table.workers tbody tr").count() == 1
    shot(page, "workers")


def test_filter_tasks_and_act_on_a_selection(page: Any, env: Env) -> None:
    log_in(page, env)
    page.goto(env.url + "/queues/default?state=scheduled")
    page.fill("#filters input[name=payload]", "to=user1@example.com")
    page.click("#filters button[type=submit]")
    rows = page.locator("table.tasks tbody tr")
    assert rows.count() == 1
    assert "1 scheduled task matching the filter" in page.locator(".card-head h2").inner_text()
    assert "payload.to=user1%40example.com" in page.url or "payload=to" in page.url
    shot(page, "search-results")
    page.fill("#filters input[name=payload]", "")
    page.fill("#filters input[name=type]", "no:such")
    page.click("#filters button[type=submit]")
    assert rows.count() == 0
    page.fill("#filters input[name=type]", "not a type")
    page.click("#filters button[type=submit]")
    assert "400" in page.locator("h1").inner_text()

    page.goto(env.url + "/queues/default?state=scheduled")
    assert rows.count() == 3
    boxes = page.locator('input[name="id"][form="selection"]')
    chosen = [boxes.nth(i).get_attribute("value") for i in (0, 2)]
    boxes.nth(0).check()
    boxes.nth(2).check()
    page.click('#selection button[data-selection="run"]')
    assert "2 of 2 task(s) queued to run now" in page.locator(".notice").inner_text()
    for task_id in chosen:
        wait_for(lambda task_id=task_id: env.state("default", task_id) == "completed")
    assert rows.count() == 1
    page.check("#pick-all")
    assert page.locator('input[name="id"][form="selection"]:checked').count() == 1
    page.click('#selection button[data-selection="delete"]')
    assert "1 of 1 task(s) deleted" in page.locator(".notice").inner_text()
    assert "No scheduled tasks" in page.locator("main").inner_text()


def test_periodic_schedules_page(page: Any, env: Env) -> None:
    log_in(page, env)
    page.click('.top nav a[href="/periodic"]')
    row = page.locator('table.periodic tr[data-entry="mail:new-year"]')
    assert "0 0 1 1 *" in row.inner_text()
    runs = row.locator("td.runs div")
    assert runs.count() == 3
    assert [runs.nth(i).inner_text()[5:] for i in range(3)] == ["01-01 00:00:00 UTC"] * 3
    assert "none found" in row.locator("td.last").inner_text()
    assert row.locator(".badge.paused").count() == 0
    page.goto(env.url + "/queues/default")
    page.click("#pause")
    page.goto(env.url + "/periodic")
    assert row.locator(".badge.paused").is_visible()
    row.locator('a[href="/queues/default"]').click()
    assert page.locator(".crumbs .badge.paused").is_visible()


@dataclass
class LimitsEnv:
    """A dashboard and a worker on one broker, with tasks of one key waiting on its limit."""

    app: durq.App
    url: str
    release: threading.Event
    ids: list[str]

    def states(self) -> list[str]:
        async def get() -> list[str]:
            try:
                infos = [await self.app.inspector.get_task_info("partners", i) for i in self.ids]
                return [info.state.value for info in infos]
            finally:
                await self.app.close()

        return run_async(get)


@pytest.fixture
def limits_env(broker_url: str) -> Iterator[LimitsEnv]:
    """Three calls to one partner with a limit of one at a time: the worker runs the first
    (which waits for ``release``) and holds the other two back, on the broker under test."""
    app = durq.App(broker_url)
    release = threading.Event()
    # A memory:// name's tasks live while a broker object on it does; the test's own calls
    # close theirs, so one is kept for the whole test (unused on the other brokers).
    keeper = app.new_broker()

    @app.task(
        "partner:call", queue="partners", limit=durq.Limit("partner:{partner}", concurrency=1)
    )
    def call(payload: dict) -> dict:
        release.wait(30)
        return {"called": payload["partner"]}

    @app.task("email:send", queue="default")
    async def send(payload: dict) -> None:
        return None

    async def seed() -> list[str]:
        migrator = app.new_broker()
        await migrator.migrate()
        await migrator.close()
        try:
            ids = [(await call.enqueue({"partner": "acme", "n": i})).id for i in range(3)]
            await app.enqueue("email:send", {"to": "a@b.c"}, process_in=3600)
            return ids
        finally:
            await app.close()

    ids = run_async(seed)
    settings = DashboardSettings(refresh_seconds=2)
    with LiveServer(create_dashboard(app, token=TOKEN, settings=settings)) as server:
        with WorkerThread(app):
            e = LimitsEnv(app, server.url, release, ids)
            try:
                wait_for(lambda: sorted(e.states()) == ["active", "pending", "pending"])
                yield e
            finally:
                release.set()
    del keeper


@pytest.fixture
def limits_page(browser: Any, limits_env: LimitsEnv) -> Iterator[Any]:
    yield from fresh_page(browser)


ACME_ROW = 'table.limits tr[data-queue="partners"][data-key="partner:acme"]'


def wait_until_two_held(page: Any, row: Any) -> None:
    """A task is counted as held once a worker has looked at it and found no room: reload
    the limits page until the partner's row shows both."""

    def waiting() -> str:
        page.reload()
        return str(row.locator('[data-field="waiting"]').inner_text())

    wait_for(lambda: waiting() == "2")


def test_limits_page_shows_running_and_held_tasks(
    limits_page: Any, limits_env: LimitsEnv, broker_kind: str
) -> None:
    from playwright.sync_api import expect

    page, env = limits_page, limits_env
    log_in(page, env)
    page.click('.top nav a[href="/limits"]')
    row = page.locator(ACME_ROW)
    wait_until_two_held(page, row)
    assert row.locator('[data-field="running"]').inner_text() == "1 FULL"
    assert row.locator('[data-field="concurrency"]').inner_text() == "1"
    assert page.locator("#sum-waiting").inner_text() == "2"
    shot(page, f"limits-held-{broker_kind}")

    # Filter by queue: a queue without limits says so in plain words.
    page.select_option("#limit-filter select[name=queue]", "default")
    page.click("#limit-filter button[type=submit]")
    page.wait_for_url(env.url + "/limits?queue=default")
    shot(page, f"limits-empty-{broker_kind}")
    assert (
        "No limit key has been counted in queue default"
        in page.locator("#limits-empty").inner_text()
    )
    page.select_option("#limit-filter select[name=queue]", "partners")
    page.click("#limit-filter button[type=submit]")
    page.wait_for_url(env.url + "/limits?queue=partners")
    assert row.is_visible()

    # The held tasks are pending in their queue; once the first call ends they all run.
    row.locator('[data-field="waiting"] a').click()
    page.wait_for_url(env.url + "/queues/partners?state=pending")  # count() does not wait
    page.wait_for_load_state()
    assert page.locator("table.tasks tbody tr").count() == 2
    page.go_back()
    page.wait_for_url(env.url + "/limits?queue=partners")
    env.release.set()
    wait_for(lambda: env.states() == ["completed"] * 3, timeout=20)
    # The page refreshes its numbers by itself (every 2 s here): no reload.
    expect(row.locator('[data-field="waiting"]')).to_have_text("0", timeout=10_000)
    expect(row.locator('[data-field="running"]')).to_have_text("0")


def test_W23_limits_page_overrides_a_key_and_resets_it(
    limits_page: Any, limits_env: LimitsEnv, broker_kind: str
) -> None:
    """An operator raises the partner's limit from the page: the worker starts a held call
    at once (its second slot), the page shows the new concurrency beside the tasks' own,
    and a reset shows the tasks' own again."""
    from playwright.sync_api import expect

    page, env = limits_page, limits_env
    log_in(page, env)
    page.goto(env.url + "/limits?queue=partners")
    row = page.locator(ACME_ROW)
    wait_until_two_held(page, row)
    assert row.locator('[data-field="concurrency"]').inner_text() == "1"
    assert row.locator(".override-reset").count() == 0
    row.locator("details.edit summary").click()
    row.locator(".override-form input[name=concurrency]").fill("3")
    row.locator(".override-form button[value=set]").click()
    page.wait_for_url(re.compile(r".*/limits\?queue=partners&notice=.*"))
    expect(page.locator(".notice")).to_contain_text("limit partner:acme overridden")
    expect(row.locator('[data-field="concurrency"]')).to_have_text("3")
    expect(row.locator('[data-field="override"]')).to_contain_text("tasks' own: 1")
    # The worker (two slots) starts one held call without a restart.
    wait_for(lambda: sorted(env.states()) == ["active", "active", "pending"], timeout=20)
    shot(page, f"limits-override-{broker_kind}")

    row.locator(".override-reset button").click()
    page.wait_for_url(re.compile(r".*/limits\?queue=partners&notice=.*"))
    expect(row.locator('[data-field="concurrency"]')).to_have_text("1")
    assert row.locator(".override-reset").count() == 0
    env.release.set()
    wait_for(lambda: env.states() == ["completed"] * 3, timeout=20)
    expect(page.locator("#sum-full")).to_have_text("0")


def test_schedule_editor_create_pause_trigger_edit_delete(page: Any, env: Env) -> None:
    def stored() -> list[Any]:
        async def main() -> list[Any]:
            try:
                return [e for e in await env.app.stored_schedules.list() if e.source == "stored"]
            finally:
                await env.app.close()

        return run_async(main)

    log_in(page, env)
    page.goto(env.url + "/periodic")
    code_row = page.locator('tr[data-entry="mail:new-year"]')
    assert code_row.get_attribute("data-source") == "code"
    assert code_row.locator("button[value=delete]").count() == 0  # code entries: read-only
    form = page.locator("form#new-schedule")
    form.locator("input[name=name]").fill("mail:weekly")
    form.locator("input[name=schedule]").fill("0 8 * * 1")
    form.locator("input[name=type]").fill("email:send")
    form.locator("input[name=payload]").fill('{"to": "team@example.com"}')
    form.locator("select[name=overlap]").select_option("skip")
    form.locator("button[type=submit]").click()
    assert "schedule mail:weekly created" in page.locator(".notice").inner_text()
    row = page.locator('tr[data-entry="mail:weekly"]')
    assert row.get_attribute("data-source") == "stored"
    assert row.get_attribute("data-state") == "active"
    (entry,) = stored()
    assert (entry.spec, entry.overlap, entry.payload) == (
        "0 8 * * 1",
        "skip",
        {"to": "team@example.com"},
    )
    shot(page, "schedule-created")

    row.locator("button[value=pause]").click()
    assert "paused" in page.locator(".notice").inner_text()
    assert page.locator('tr[data-entry="mail:weekly"]').get_attribute("data-state") == "paused"
    assert stored()[0].paused

    page.locator('tr[data-entry="mail:weekly"] button[value=trigger]').click()
    notice = page.locator(".notice").inner_text()
    assert "enqueued periodic:mail:weekly:run:" in notice
    task_id = notice.rsplit(" ", 1)[1]
    wait_for(lambda: env.state("default", task_id) == "completed")  # the worker ran it

    row = page.locator('tr[data-entry="mail:weekly"]')
    row.locator("details.edit summary").click()
    row.locator("details.edit input[name=schedule]").fill("30 9 * * 1-5")
    row.locator("details.edit button[type=submit]").click()
    assert "schedule mail:weekly saved" in page.locator(".notice").inner_text()
    assert "30 9 * * 1-5" in page.locator('tr[data-entry="mail:weekly"] .chip').inner_text()
    assert stored()[0].payload == {"to": "team@example.com"}  # the prefilled fields kept
    shot(page, "schedule-edited")

    page.locator('tr[data-entry="mail:weekly"] button[value=delete]').click()
    assert "deleted" in page.locator(".notice").inner_text()
    assert page.locator('tr[data-entry="mail:weekly"]').count() == 0
    assert stored() == []


def test_W14_task_page_follows_a_running_task_s_progress_and_log(page: Any, env: Env) -> None:
    from playwright.sync_api import expect

    async def enqueue() -> None:
        await env.app.enqueue("import:rows", {}, queue="reports", task_id="import-1")
        await env.app.close()

    def reported() -> bool:
        async def get(inspector: Inspector) -> bool:
            return (await inspector.get_task_info("reports", "import-1")).progress is not None

        return env.call(get)

    log_in(page, env)
    run_async(enqueue)
    wait_for(reported)
    page.goto(env.url + "/queues/reports/tasks/import-1")
    assert page.locator("#task-state").text_content() == "active"
    assert page.locator("#progress-text").inner_text() == "40% rows 400/1000 (attempt 1)"
    assert page.locator("#progress-bar").get_attribute("value") == "0.4"
    assert "info started" in page.locator("#task-log").inner_text()
    shot(page, "task-progress")
    # The page polls the admin API while the task runs: no reload from here on.
    env.gates[0].set()
    expect(page.locator("#progress-text")).to_have_text("80% rows 800/1000 (attempt 1)")
    assert "warning slow row 17" in page.locator("#task-log").inner_text()
    assert page.locator("#progress-bar").evaluate("el => el.value") == 0.8
    env.gates[1].set()
    expect(page.locator("#task-state")).to_have_text("completed")
    assert page.locator("#task-log").inner_text().count("attempt 1") == 2
