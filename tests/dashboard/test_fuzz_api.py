"""Fuzz the admin API from its own (generated) OpenAPI document with schemathesis and every
check it has (``--checks all``: no 5xx, status codes, headers and bodies as documented,
negative data refused, authentication enforced, truthful ``Allow``). Served by uvicorn on
loopback over a real SQLite broker, the document fetched from the server itself.

Reproduce by hand: ``durq dash --token T`` and
``schemathesis run http://127.0.0.1:8181/api/openapi.json --checks all -H 'Authorization:
Bearer T'``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import durq
from durq.dashboard import DashboardSettings, create_dashboard
from fuzzkit import schemathesis_run

from .conftest import BEARER, TOKEN
from .live import LiveServer

pytestmark = pytest.mark.slow  # minutes of requests: started first under pytest-xdist


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[str]:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")

    async def seed() -> None:
        await (await app.broker()).migrate()
        for i in range(3):
            await app.enqueue("email:send", {"n": i}, task_id=f"t{i}")
        await app.enqueue("email:send", {}, queue="low", process_in=600)
        await app.close()

    asyncio.run(seed())
    # The fuzzer sends wrong credentials on purpose (to check they are refused): no
    # lock-out for it, or every later request would be 429.
    settings = DashboardSettings(auth_failure_limit=10**9)
    with LiveServer(create_dashboard(app, token=TOKEN, settings=settings)) as server:
        yield server.url


#: A schedule's cron expression and time zone, and a backfill's range, are checked for what
#: they mean (croniter, zoneinfo, the number of ticks), and so are a limit override's key
#: (printable characters, as tasks resolve it) and rate ("10/s"), which no JSON schema can
#: say: for these operations a 400 is the documented answer to a well-formed request too.
SEMANTIC_400 = """
[[operations]]
include-path-regex = "^/api/(schedules|limits/)"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx",
]
"""


def test_admin_api_passes_every_schemathesis_check(live_api: str, tmp_path: Path) -> None:
    run = schemathesis_run(
        f"{live_api}/api/openapi.json",
        headers=BEARER,
        max_examples=20,
        workdir=tmp_path,
        config=SEMANTIC_400,
    )
    assert run.generated >= 300 and run.passed == run.generated
