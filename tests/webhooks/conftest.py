"""Fixtures of the webhook tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from webhook_receiver import Receiver, serve_receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP receiver on loopback (see :class:`webhook_receiver.Receiver`)."""
    with serve_receiver() as state:
        yield state
