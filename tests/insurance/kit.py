"""Helpers for the reference service's tests: servers, clients, storage counts."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ lives at the repository root
    sys.path.insert(0, str(ROOT))

from examples.insurance.config import Settings  # noqa: E402
from examples.insurance.serve import BackgroundServer  # noqa: E402
from examples.insurance.store import NewOrder  # noqa: E402
from examples.insurance.tasks import COVERAGE_QUEUE  # noqa: E402

ALICE, BOB = "tok-alice", "tok-bob"
#: The secret the simulated partner and the service share for callbacks.
PARTNER_SECRET = "partner-secret-for-tests"


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (HTTP state has no event to wait on)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(interval)


def worker_env(settings: Settings) -> dict[str, str]:
    """The environment of a split worker process (or API) running with ``settings``."""
    return {
        **os.environ,
        **settings.to_env(),
        "INSURANCE_SHUTDOWN_TIMEOUT": "2",
        # The tree under test first, then what the tests run with (a checkout sharing
        # another one's virtual environment puts its own src/ there).
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


class Sim:
    """The running simulator and its control API."""

    def __init__(self, server: BackgroundServer) -> None:
        self.server = server
        self.url = server.url
        self.http = httpx.Client(base_url=server.url, timeout=5)

    def configure(self, **knobs: Any) -> None:
        current = self.http.get("/_sim/config").json()
        current.update(knobs)
        self.http.put("/_sim/config", json=current).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return dict(self.http.get("/_sim/stats").json())

    def reset_when_idle(self) -> None:
        """Zero the counters once no call is in flight: a slow call an earlier test left
        behind (the simulator is shared by the session) would count toward this test's
        concurrency."""
        wait_for(lambda: self.stats()["in_flight"] == 0, timeout=30)
        self.http.post("/_sim/reset").raise_for_status()


class Service:
    """The running API and an HTTP client per customer."""

    def __init__(self, server: BackgroundServer, app: Any, settings: Settings) -> None:
        self.server = server
        self.app = app
        self.settings = settings
        self.url = server.url
        self.alice = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ALICE}"})
        self.bob = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {BOB}"})
        self.anon = httpx.Client(base_url=server.url)

    def order(self, location: str, client: httpx.Client | None = None) -> dict[str, Any]:
        return dict((client or self.alice).get(location).json())

    def wait_status(
        self, location: str, status: str, timeout: float = 10.0, task_state: str | None = None
    ) -> dict[str, Any]:
        """The order once it has ``status`` (and its task ``task_state``, when given).

        The handler writes the order's status before its task is acknowledged, so
        the task's state lags the status by one ack: wait for both, not one then
        read the other.
        """

        def ready() -> Any:
            o = self.order(location)
            if o["status"] != status or (task_state and o["task_state"] != task_state):
                return False
            return o

        return dict(wait_for(ready, timeout))

    def close(self) -> None:
        for c in (self.alice, self.bob, self.anon):
            c.close()
        self.server.stop()


ITEMS = {"items": [{"sku": "A-1", "qty": 2}]}


def inspector_call(settings: Settings, call: Callable[[Any], Any]) -> Any:
    """``call(app.inspector)`` on a fresh client of the service's broker, from sync code."""
    import durq

    app = durq.App(settings.broker_url)
    try:
        return app.run_sync(lambda: call(app.inspector))
    finally:
        app.close_sync()


def migrate(url: str) -> None:
    """Create or update the broker's schema at ``url``, as ``durq migrate`` does."""
    import asyncio

    from durq.brokers import open_broker

    async def run() -> None:
        broker = open_broker(url)
        try:
            await broker.migrate()
        finally:
            await broker.close()

    asyncio.run(run())


def coverage_tasks(settings: Settings) -> int:
    """The durq tasks in the coverage queue, in every state."""
    queues = inspector_call(settings, lambda inspector: inspector.list_queues())
    return sum(q.size for q in queues if q.name == COVERAGE_QUEUE)


def counts(target: Settings | Service) -> tuple[int, int]:
    """(orders saved, durq tasks in the coverage queue), read straight from storage."""
    import sqlite3

    settings = target.settings if isinstance(target, Service) else target
    path = settings.database_url.removeprefix("sqlite:///")
    try:
        conn = sqlite3.connect(path)
        try:
            orders = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:
        orders = 0
    return int(orders), coverage_tasks(settings)


def saved(service: Service) -> tuple[int, list[str]]:
    """(orders saved, coverage tasks without an order): what a request can leave behind.

    Unlike :func:`counts`, this does not move while the service's own worker finishes or
    retries earlier orders' tasks, so a test sharing one service can compare it before and
    after a request: a refused request adds no order, and no task ever lacks its order."""
    import sqlite3

    from durq import TaskState

    async def coverage_ids(inspector: Any) -> set[str]:
        ids: set[str] = set()
        for state in TaskState:
            offset = 0
            while page := await inspector.list_tasks(
                COVERAGE_QUEUE, state, limit=1000, offset=offset
            ):
                ids.update(t.id for t in page if t.id.startswith("coverage:"))
                offset += len(page)
        return ids

    # Tasks first, orders second: an order is saved before (or with) its task, so every task
    # read here has its order in the later read.
    tasks = inspector_call(service.settings, coverage_ids)
    conn = sqlite3.connect(service.settings.database_url.removeprefix("sqlite:///"))
    try:
        orders = {row[0] for row in conn.execute("SELECT id FROM orders")}
    finally:
        conn.close()

    return len(orders), sorted(t for t in tasks if t.removeprefix("coverage:") not in orders)


def post_twice_with_one_key(service: Service, key: str) -> None:
    """The same order posted twice with one Idempotency-Key: 202, then 200 for the same task,
    and the order ends COVERED (H1, H2)."""
    first = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": key})
    assert first.status_code == 202
    again = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": key})
    assert again.status_code == 200 and again.json()["task_id"] == first.json()["task_id"]
    assert service.wait_status(first.headers["Location"], "COVERED")["policy_number"]


async def check_rollback_leaves_neither(app: Any, store: Any) -> None:
    """E8: an enqueue that joined the order's transaction, then a failure: after the rollback
    neither the order nor its task exists. ``store`` is open and transactional."""
    import durq

    order = NewOrder(
        id="ord_" + "0" * 24,
        customer="alice",
        idempotency_key="k",
        request_hash="h",
        items=[{"sku": "A-1", "qty": 1}],
        task_id="coverage:ord_" + "0" * 24,
    )

    async def enqueue_then_fail(orders: Any, connection: Any) -> Any:
        assert connection is not None  # the task joins the order's transaction (E8)
        assert [o.id for o in orders] == [order.id]
        await app.enqueue(
            "insurance:check_coverage",
            {"order_id": order.id},
            queue=COVERAGE_QUEUE,
            task_id=order.task_id,
            connection=connection,
        )
        raise RuntimeError("the handler failed after the enqueue")

    with pytest.raises(RuntimeError):
        await store.create(order, enqueue_then_fail)
    assert await store.count() == 0
    with pytest.raises(durq.TaskNotFoundError):
        await app.inspector.get_task_info(COVERAGE_QUEUE, order.task_id)


class DemoRun:
    """``durq demo`` as a child process: its stdout lines as they come, Ctrl-C at the end."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        import subprocess
        import threading

        self.proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.code: int | None = None
        stdout = self.proc.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(stdout.readline, "")))
        self._reader.start()

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the banner's last line is printed; the process must still run."""
        wait_for(
            lambda: (
                any(line.startswith("Ctrl-C") for line in self.lines)
                or self.proc.poll() is not None
            ),
            timeout=timeout,
        )
        assert self.proc.poll() is None, self.stderr()

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr else ""

    def __enter__(self) -> DemoRun:
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        self.proc.send_signal(signal.SIGINT)
        try:
            self.code = self.proc.wait(timeout=30)
        finally:
            self.proc.kill()
            self._reader.join(5)
