"""The pytest plugin of the testing kit, registered as ``durq`` (entry point ``pytest11``).

Fixtures, each fresh per test (nothing is shared between tests):

* ``durq_app``: a :class:`durq.App` on its own in-memory broker with a fake clock. With
  ``durq_app = "package.module:app"`` in the pytest configuration, it is *your* app,
  pointed at a fresh in-memory broker for the test and given back its own afterwards.
* ``durq_worker``: a :class:`~durq.testing.TestWorker` on ``durq_app``. It starts on the
  test's event loop at its first ``await``, so it works under pytest-asyncio (any mode) and
  anyio alike.
* ``durq_worker_sync``: a :class:`~durq.testing.SyncTestWorker` on ``durq_app``, for sync
  (WSGI, Django) tests.
* ``durq_clock``: the fake clock of ``durq_app`` and its workers.

The workers take :class:`~durq.testing.TestWorker` options from a ``durq_worker`` marker on
the test (or its class or module): ``@pytest.mark.durq_worker(scheduler=True)`` has them
enqueue periodic tasks as the fake clock reaches their ticks, which they do not by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import durq
from durq.cli.common import load_app
from durq.clock import FakeClock
from durq.testing.driver import SyncTestWorker, TestWorker, in_memory


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "durq_app",
        "module:attribute of the durq.App that the durq_app fixture points at a fresh "
        "in-memory broker for each test (default: a new, empty App)",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "durq_worker(**options): durq.testing.TestWorker options of the durq_worker and "
        "durq_worker_sync fixtures, e.g. scheduler=True to run periodic tasks",
    )


def worker_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The options of the closest ``durq_worker`` marker (test, then class, then module)."""
    marker = request.node.get_closest_marker("durq_worker")
    if marker is None:
        return {}
    if marker.args:
        raise pytest.UsageError("the durq_worker marker takes keyword options only")
    return dict(marker.kwargs)


@pytest.fixture
def durq_app(request: pytest.FixtureRequest) -> Iterator[durq.App]:
    """A durq App on a fresh in-memory broker and a fake clock, for this test only."""
    spec = str(request.config.getini("durq_app") or "")
    app = load_app(spec) if spec else durq.App("memory://")
    with in_memory(app) as bound:
        yield bound


@pytest.fixture
def durq_clock(durq_app: durq.App) -> FakeClock:
    """The fake clock of ``durq_app``: move it to make scheduled tasks and retries due."""
    assert isinstance(durq_app.clock, FakeClock)
    return durq_app.clock


@pytest.fixture
def durq_worker(durq_app: durq.App, request: pytest.FixtureRequest) -> Iterator[TestWorker]:
    """A test worker on ``durq_app``; ``await durq_worker.drain()`` runs what is due.

    Options from ``@pytest.mark.durq_worker(...)`` (``scheduler=True``, ``queues=``...)."""
    worker = TestWorker(durq_app, **worker_options(request))
    yield worker
    worker.close_nowait()


@pytest.fixture
def durq_worker_sync(
    durq_app: durq.App, request: pytest.FixtureRequest
) -> Iterator[SyncTestWorker]:
    """The blocking test worker on ``durq_app``, for WSGI, Django and ``TestClient`` tests;
    options as ``durq_worker``."""
    with SyncTestWorker(durq_app, **worker_options(request)) as worker:
        yield worker
