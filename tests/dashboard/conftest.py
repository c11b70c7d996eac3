"""Fixtures of the dashboard tests: a migrated SQLite app, the dashboard as an ASGI app and
an httpx client talking to it in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import durq
from durq.dashboard import create_dashboard

TOKEN = "test-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[durq.App]:
    application = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")

    @application.task("email:send", queue="default")
    async def send(payload: dict) -> dict:
        return {"sent": True}

    broker = await application.broker()
    await broker.migrate()
    yield application
    await application.close()


@pytest.fixture
def dashboard(app: durq.App):
    return create_dashboard(app, token=TOKEN)


@pytest.fixture
async def client(dashboard) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


@pytest.fixture
async def api(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The client with the bearer token."""
    client.headers.update(BEARER)
    return client
