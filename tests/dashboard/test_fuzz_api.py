"""Fuzz the admin API from its own OpenAPI document (schemathesis): no 5xx, every status
code and body as documented. Served by uvicorn on loopback over a real SQLite broker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

import durq
from durq.dashboard import create_dashboard
from durq.dashboard.openapi import openapi_document

from .conftest import BEARER, TOKEN
from .live import LiveServer


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
    with LiveServer(create_dashboard(app, token=TOKEN)) as server:
        yield server.url


def test_admin_api_never_fails(live_api: str) -> None:
    schema = schemathesis.openapi.from_dict(openapi_document())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    statuses: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call_and_validate(
                base_url=live_api,
                headers=BEARER,
                checks=[
                    not_a_server_error,
                    status_code_conformance,
                    content_type_conformance,
                    response_schema_conformance,
                ],
            )
            statuses.append(response.status_code)

        check()
    # it really talked to the server, and saw both answers and refusals
    assert len(statuses) >= 50
    assert 200 in statuses and 404 in statuses
