"""Monolith or split, SQLite or PostgreSQL: the same service, assembled differently (H5, E8)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.insurance.config import Settings
from examples.insurance.store import PostgresOrderStore

import durq
from insurance.kit import (
    ITEMS,
    Service,
    Sim,
    check_rollback_leaves_neither,
    counts,
    coverage_tasks,
    migrate,
    post_twice_with_one_key,
)
from servers import PG_DSN, broker_url_for, drop_isolated, require_server, unique_name


def test_split_api_and_python_worker(
    start_service: Any, settings: Settings, sim: Sim, split_worker: Any
) -> None:
    service: Service = start_service(settings.with_(monolith=False))
    assert service.anon.get("/health").json()["mode"] == "split"
    location = service.alice.post("/orders", json=ITEMS).headers["Location"]
    # No worker in the API process: the order waits in the broker.
    assert service.order(location)["task_state"] == "pending"
    split_worker([sys.executable, "-m", "examples.insurance.worker"])
    assert service.wait_status(location, "COVERED", timeout=20)["policy_number"]


def test_split_api_and_durq_worker_cli(
    start_service: Any, settings: Settings, sim: Sim, split_worker: Any
) -> None:
    durq_bin = shutil.which("durq", path=str(Path(sys.executable).parent))
    if durq_bin is None:
        pytest.skip("the durq console script is not installed in this environment")
    service: Service = start_service(settings.with_(monolith=False))
    location = service.alice.post("/orders", json=ITEMS).headers["Location"]
    split_worker([durq_bin, "worker", "examples.insurance.worker:app", "--queues", "insurance"])
    assert service.wait_status(location, "COVERED", timeout=20)["policy_number"]


def test_partner_bulkhead_holds_across_worker_processes(
    start_service: Any, settings: Settings, sim: Sim, split_worker: Any
) -> None:
    """Two worker processes of 10 slots each, a bulkhead of 2: the partner never sees more
    than 2 calls at once, because the limit is counted by the broker, not per process."""
    split = settings.with_(monolith=False, bulkhead=2, warehouses={})
    service: Service = start_service(split)
    sim.configure(latency=0.1, pending_polls=0)
    sim.reset_when_idle()
    locations = [service.alice.post("/orders", json=ITEMS).headers["Location"] for _ in range(8)]
    for _ in range(2):
        split_worker([sys.executable, "-m", "examples.insurance.worker"], split)
    for location in locations:
        service.wait_status(location, "COVERED", timeout=30)
    stats = sim.stats()
    assert stats["calls"] >= 16
    assert stats["max_in_flight"] == 2


# -- PostgreSQL: the order and its task in one transaction ---------------------------------


@pytest.fixture
def pg_settings(settings: Settings, tmp_path: Path) -> Iterator[Settings]:
    require_server("postgres")
    pytest.importorskip("durq.brokers.postgres", reason="the PostgreSQL broker is not installed")
    broker_url = broker_url_for("postgres", tmp_path)
    schema = unique_name("insurance_test")
    migrate(broker_url)  # as `durq migrate` does before a deploy
    yield settings.with_(broker_url=broker_url, database_url=PG_DSN, database_schema=schema)
    drop_isolated("postgres", broker_url)
    drop_isolated("postgres", f"{PG_DSN}?schema={schema}")


def pg_counts(settings: Settings) -> tuple[int, int]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_DSN) as conn:
        query = sql.SQL("SELECT count(*) FROM {}.orders").format(
            sql.Identifier(settings.database_schema)
        )
        orders = conn.execute(query).fetchone()[0]
    return int(orders), coverage_tasks(settings)


def test_postgres_flow_in_one_transaction(
    start_service: Any, pg_settings: Settings, sim: Sim
) -> None:
    service: Service = start_service(pg_settings)
    assert service.app.state.runtime.store.transactional is True
    post_twice_with_one_key(service, "pg-1")
    assert pg_counts(pg_settings) == (1, 1)


async def test_postgres_rollback_leaves_neither_order_nor_task(pg_settings: Settings) -> None:
    app = durq.App(pg_settings.broker_url)
    store = PostgresOrderStore(PG_DSN, pg_settings.database_schema, transactional=True)
    await store.open()
    try:
        await check_rollback_leaves_neither(app, store)
    finally:
        await store.close()
        await app.close()


def test_503_when_postgres_is_unreachable(start_service: Any, settings: Settings, sim: Sim) -> None:
    pytest.importorskip("durq.brokers.postgres", reason="the PostgreSQL broker is not installed")
    down = settings.with_(broker_url="postgresql://postgres@127.0.0.1:1/test", monolith=False)
    service: Service = start_service(down)
    answer = service.alice.post("/orders", json=ITEMS)
    assert answer.status_code == 503 and answer.headers["Retry-After"]
    assert counts(settings)[0] == 0  # the order was compensated away
