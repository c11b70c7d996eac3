"""Connection URLs put back together and redacted (``durq.urls``)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from durq.urls import redact, unsplit


@pytest.mark.parametrize(
    "url",
    [
        "unix:///tmp/redis.sock?db=2",
        "postgresql:///app?host=/run/postgresql",
        "redis://:secret@127.0.0.1:6379/3?socket_timeout=1.5",
        "rediss://user:pw@cache.example:6380/0",
        "postgresql://u@h:5432/db#frag",
    ],
)
def test_a_url_comes_back_as_it_was(url: str) -> None:
    assert unsplit(urlsplit(url)) == url


def test_the_password_alone_is_hidden() -> None:
    assert redact("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"
    assert (
        redact("postgresql://u:p@h/db?sslmode=require") == "postgresql://u:***@h/db?sslmode=require"
    )
    assert redact("unix:///tmp/redis.sock?db=2") == "unix:///tmp/redis.sock?db=2"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
