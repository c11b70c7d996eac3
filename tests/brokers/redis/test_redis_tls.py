"""``rediss://``: the whole Redis conformance suite against a real redis-server that speaks
only TLS, started here with certificates made by openssl. Scripts, wake-ups and the
inspector's reads all cross the TLS connection (a plain connection is refused: the server
has no plain port)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.redis import RedisBroker
from durq.errors import BrokerUnavailableError
from servers import TlsRedis

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.skip("redis-server and openssl are needed")
    server = TlsRedis(tmp_path_factory.mktemp("tls"))
    yield server
    server.kill()


async def test_a_task_goes_through_a_tls_server(tls_redis: TlsRedis) -> None:
    broker = RedisBroker.from_url(f"{tls_redis.url}&prefix=tls")
    try:
        await broker.migrate()
        await broker.enqueue(EnqueueParams(id="t", queue="q", type="x", payload=b"{}"))
        (lease,) = await broker.claim(ClaimParams(["q"], 1, "w", 30))
        assert lease.task.id == "t" and (await broker.admin.list_queues())[0].name == "q"
    finally:
        await broker.close()


async def test_a_certificate_from_an_unknown_authority_is_refused(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    other = TlsRedis(tmp_path / "other")  # only for its CA: another authority
    other.kill()
    url = f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={other.ca}&prefix=tls"
    broker = RedisBroker.from_url(url)
    try:
        with pytest.raises(BrokerUnavailableError):
            await broker.connect()
    finally:
        await broker.close()


@pytest.mark.timeout(900)
def test_the_conformance_suite_passes_over_tls(tls_redis: TlsRedis) -> None:
    env = {**os.environ, "DURQ_TEST_REDIS": tls_redis.url}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/conformance",
            "-q",
            "-x",
            "-k",
            "redis and not cluster",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
