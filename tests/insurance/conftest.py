"""Fixtures for the reference service: the real simulator and the real API, each served by
uvicorn on a free loopback port, with a short backoff so flows finish in fractions of a second.

The simulator runs once per session and is reset before every test; the API runs per test
(``service``) or once per module for tests that only read answers (``shared_service``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.insurance import partner_sim
from examples.insurance.api import create_app
from examples.insurance.config import Settings
from examples.insurance.serve import BackgroundServer, bind

from insurance.kit import ALICE, BOB, PARTNER_SECRET, ROOT, Service, Sim, worker_env


@pytest.fixture(scope="session")
def sim_server() -> Iterator[Sim]:
    config = partner_sim.SimConfig(pending_polls=1, seed=7)
    with BackgroundServer(partner_sim.create_app(config)) as server:
        s = Sim(server)
        yield s
        s.http.close()


@pytest.fixture
def sim(sim_server: Sim) -> Sim:
    sim_server.http.post("/_sim/reset", params={"forget": "true"}).raise_for_status()
    return sim_server


def make_settings(directory: Path, sim: Sim) -> Settings:
    return Settings(
        broker_url=f"sqlite:///{directory / 'durq.sqlite3'}",
        # Orders in the broker's file: one transaction for an order and its task (E8).
        database_url=f"sqlite:///{directory / 'durq.sqlite3'}",
        tokens={ALICE: "alice", BOB: "bob"},
        partner_url=sim.url,
        warehouses={"north": sim.url, "south": sim.url},
        backoff_base=0.01,
        backoff_cap=0.05,
        call_timeout=2.0,
        fanout_timeout=2.0,
        in_memory_wait=0.3,
        breaker_failures=3,
        breaker_reset=0.3,
        worker_poll=0.05,
        shutdown_timeout=2.0,
    )


@pytest.fixture
def settings(tmp_path: Path, sim: Sim) -> Settings:
    return make_settings(tmp_path, sim)


@pytest.fixture
def start_service() -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def start(settings: Settings, *, callbacks: bool = False) -> Service:
        """The API with ``settings``; with ``callbacks``, it asks the partner to call back
        (at its own URL, known before it starts) and takes callbacks signed with
        :data:`PARTNER_SECRET`."""
        sock = bind()
        if callbacks:
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/partner/callbacks/coverage"
            settings = settings.with_(callback_url=url, partner_secret=PARTNER_SECRET)
        app = create_app(settings, configure_logging=False)
        service = Service(BackgroundServer(app, sock=sock).start(), app, settings)
        started.append(service)
        return service

    yield start
    for service in started:
        service.close()


@pytest.fixture
def service(start_service: Callable[[Settings], Service], settings: Settings) -> Service:
    return start_service(settings)


@pytest.fixture(scope="module")
def shared_service(tmp_path_factory: pytest.TempPathFactory, sim_server: Sim) -> Iterator[Service]:
    settings = make_settings(tmp_path_factory.mktemp("shared"), sim_server)
    app = create_app(settings, configure_logging=False)
    service = Service(BackgroundServer(app).start(), app, settings)
    yield service
    service.close()


@pytest.fixture
def split_worker(settings: Settings) -> Iterator[Any]:
    """Start a separate worker process; stopped with SIGTERM (graceful) at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], settings: Settings = settings) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(command, cwd=ROOT, env=worker_env(settings))
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        assert proc.wait(timeout=15) == 0  # a graceful stop exits cleanly
