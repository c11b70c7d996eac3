from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import durq


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[durq.App]:
    application = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    await (await application.broker()).migrate()
    yield application
    await application.close()
