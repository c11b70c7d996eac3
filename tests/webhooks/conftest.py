"""Fixtures of the webhook tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from webhook_receiver import LOOPBACK, Receiver, serve_receiver

from durq import webhooks
from observability.conftest import app  # noqa: F401 - a migrated SQLite app


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """A real HTTP receiver on loopback (see :class:`webhook_receiver.Receiver`); apps made
    after this fixture may deliver there (loopback on their allow-list)."""
    monkeypatch.setenv(webhooks.ALLOW_ENV, LOOPBACK)
    with serve_receiver() as state:
        yield state
