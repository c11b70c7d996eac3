"""PostgreSQL behind PgBouncer (transaction pooling) without a direct ``listen_url``: workers
poll, say so once, and still run every task. The rest of the contract through PgBouncer is
the conformance suite's ``postgres-pgbouncer`` kind."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

import pytest

import durq
from conformance.apps import FAST, wait_for_state
from durq.brokers.postgres import PostgresBroker
from durq.errors import ConfigurationError
from durq.states import TaskState
from servers import PG_DSN, PgBouncer


def bouncer_url(bouncer: PgBouncer, schema: str, **options: str) -> str:
    query = urlencode({"schema": schema, **options})
    return f"postgresql://{bouncer.user}@127.0.0.1:{bouncer.port}/{bouncer.database}?{query}"


async def test_without_listen_url_workers_poll_and_warn_once(
    pgbouncer: PgBouncer, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = durq.App(bouncer_url(pgbouncer, schema, pgbouncer="1"))
    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    ran: list[int] = []

    @app.task("poll:job", retention=60)
    def job(payload: dict[str, Any]) -> int:
        ran.append(int(payload["n"]))
        return int(payload["n"])

    caplog.set_level(logging.WARNING, logger="durq.brokers.postgres")
    try:
        async with app.worker(**FAST):
            infos = [await job.enqueue({"n": n}) for n in range(3)]
            for info in infos:
                await wait_for_state(app, "default", info.id, TaskState.COMPLETED, timeout=15)
    finally:
        await app.close()
    assert sorted(ran) == [0, 1, 2]
    warnings = [r.getMessage() for r in caplog.records if "listen_url" in r.getMessage()]
    assert len(warnings) == 1 and "poll" in warnings[0]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("pgbouncer=maybe", "pgbouncer must be"),
        ("pgbouncer=1&listen_url=redis://127.0.0.1:6379/0", "listen_url must be"),
    ],
)
def test_bad_pgbouncer_options_are_configuration_errors(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        PostgresBroker.from_url(f"{PG_DSN}?{query}")
