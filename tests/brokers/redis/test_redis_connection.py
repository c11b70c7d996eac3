"""Bad input and bad servers give typed errors promptly (E7), never a hang or a driver error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from durq.brokers import open_broker
from durq.brokers.base import EnqueueParams
from durq.brokers.redis import RedisBroker
from durq.brokers.redis.storage import _version
from durq.errors import BrokerError, BrokerUnavailableError, ConfigurationError, SchemaError
from servers import REDIS_URL, free_port, raw_redis

PROMPT = 4.0


def task(task_id: str = "t") -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="default", type="test:task", payload=b"{}")


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """Accepts connections and never answers (a hung or firewalled peer)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for w in held:
        w.close()
    server.close()


@pytest.fixture
async def http_server() -> AsyncIterator[int]:
    """Answers anything with an HTTP error, like a web server on the wrong port."""

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(100)
        w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await w.drain()
        w.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def test_nothing_listening_raises_unavailable_promptly() -> None:
    broker = RedisBroker.from_url(f"redis://127.0.0.1:{free_port()}/0")
    start = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as err:
        await broker.enqueue(task())
    assert err.value.operation in ("redis.connect", "redis.enqueue")
    assert time.monotonic() - start < PROMPT
    with pytest.raises(BrokerUnavailableError) as err:
        await broker.ping()
    assert err.value.operation == "redis.ping"
    await broker.close()


async def test_a_peer_that_never_answers_times_out(silent_server: int) -> None:
    broker = RedisBroker.from_url(f"redis://127.0.0.1:{silent_server}/0?socket_timeout=0.5")
    start = time.monotonic()
    with pytest.raises(BrokerUnavailableError):
        await broker.connect()
    assert time.monotonic() - start < PROMPT
    await broker.close()


async def test_a_server_that_is_not_redis_is_refused(http_server: int) -> None:
    broker = RedisBroker.from_url(f"redis://127.0.0.1:{http_server}/0")
    with pytest.raises(BrokerError, match="does not speak the Redis protocol"):
        await broker.connect()
    await broker.close()


async def test_wrong_credentials_are_a_broker_error_not_a_hang(private_redis) -> None:
    server = private_redis("--requirepass", "s3cret")
    bad = RedisBroker.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0")
    with pytest.raises(BrokerError, match="refused the credentials") as err:
        await bad.connect()
    assert "wrong" not in str(err.value)  # the password is never echoed
    await bad.close()
    missing = RedisBroker.from_url(server.url)
    with pytest.raises(BrokerError):
        await missing.connect()
    await missing.close()
    good = RedisBroker.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/0")
    await good.connect()
    assert (await good.enqueue(task())).id == "t"
    await good.close()


async def test_too_old_a_server_is_refused(rbroker: RedisBroker, monkeypatch) -> None:
    fresh = RedisBroker.from_url(f"{REDIS_URL}?prefix={rbroker.prefix}")

    real = fresh._storage.command

    async def old_info(*args: Any) -> Any:
        if args[:1] == ("INFO",):
            return b"# Server\r\nredis_version:6.0.16\r\n"
        return await real(*args)

    monkeypatch.setattr(fresh._storage, "command", old_info)
    with pytest.raises(SchemaError, match=r"too old: durq needs Redis 6\.2"):
        await fresh.connect()
    await fresh.close()


def test_version_parsing() -> None:
    assert _version("7.0.15") == (7, 0, 15)
    assert _version("6.2") >= (6, 2)
    assert _version("6.0.99") < (6, 2)
    assert _version("255.255.255-rc1") > (6, 2)


async def test_other_layout_version_is_a_schema_error(rbroker: RedisBroker) -> None:
    await raw_redis(rbroker).set(f"{rbroker.prefix}:schema", "99")
    fresh = RedisBroker.from_url(f"{REDIS_URL}?prefix={rbroker.prefix}")
    with pytest.raises(SchemaError, match="layout 99"):
        await fresh.connect()
    await fresh.close()


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:6379/0?prefix=a*b",
        "redis://127.0.0.1:6379/0?prefix=",
        "redis://127.0.0.1:6379/notadb",
    ],
)
def test_malformed_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        RedisBroker.from_url(url)


def test_prefix_is_taken_out_of_the_url_and_other_options_pass_through() -> None:
    broker = RedisBroker.from_url("redis://127.0.0.1:6379/3?prefix=app1&socket_timeout=1.5")
    assert broker.prefix == "app1"
    kwargs = broker._storage.pool.connection_kwargs
    assert kwargs["db"] == 3 and kwargs["socket_timeout"] == 1.5
    unix = open_broker("unix:///tmp/redis.sock?prefix=u1&db=2")
    assert isinstance(unix, RedisBroker) and unix.prefix == "u1"
    assert unix._storage.pool.connection_kwargs["path"] == "/tmp/redis.sock"
