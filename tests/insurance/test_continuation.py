"""On SQLite the order and its coverage task are written in one transaction (E8), and an
order whose coverage task is archived by any path ends FAILED (the continuation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from examples.insurance.config import Settings
from examples.insurance.store import SQLiteOrderStore, open_store
from examples.insurance.tasks import COVERAGE_QUEUE, FINALIZE_TASK

import durq
from insurance.kit import (
    ITEMS,
    Service,
    Sim,
    check_rollback_leaves_neither,
    counts,
    inspector_call,
    post_twice_with_one_key,
    wait_for,
)


def test_sqlite_order_and_task_in_one_transaction(service: Service, sim: Sim) -> None:
    assert service.app.state.runtime.store.transactional is True
    post_twice_with_one_key(service, "one-tx")
    assert counts(service) == (1, 1)


async def test_sqlite_rollback_leaves_neither_order_nor_task(settings: Settings) -> None:
    app = durq.App(settings.broker_url)
    store = open_store(
        settings.database_url, "", transactional=True, broker_url=settings.broker_url
    )
    assert isinstance(store, SQLiteOrderStore) and store.transactional
    await store.open()
    await app.broker()  # the durq tables exist before a transaction writes into them
    try:
        await check_rollback_leaves_neither(app, store)
    finally:
        await store.close()
        await app.close()


def test_orders_in_another_file_save_then_enqueue(
    start_service: Any, settings: Settings, sim: Sim, tmp_path: Path
) -> None:
    apart = settings.with_(database_url=f"sqlite:///{tmp_path / 'orders.sqlite3'}")
    service: Service = start_service(apart)
    assert service.app.state.runtime.store.transactional is False
    location = service.alice.post("/orders", json=ITEMS).headers["Location"]
    assert service.wait_status(location, "COVERED")["policy_number"]


def order_sleeping_between_polls(
    start_service: Any, settings: Settings, sim: Sim
) -> tuple[Service, str, str]:
    """An order whose coverage task waits (for the partner's callback, or its next poll far
    away): the partner keeps answering "pending". Returns the service, the order's location
    and the task id."""
    sim.configure(pending_polls=1000)
    service: Service = start_service(settings.with_(backoff_base=60.0, backoff_cap=60.0))
    answer = service.alice.post("/orders", json=ITEMS)
    location, task_id = answer.headers["Location"], answer.json()["task_id"]
    wait_for(lambda: service.order(location)["task_state"] == "waiting")
    return service, location, task_id


def test_task_archived_by_the_inspector_marks_the_order_failed(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    service, location, task_id = order_sleeping_between_polls(start_service, settings, sim)
    assert service.order(location)["status"] == "PENDING"
    inspector_call(settings, lambda i: i.archive_task(COVERAGE_QUEUE, task_id))
    order = service.wait_status(location, "FAILED")
    assert f"coverage task {task_id} archived" in order["last_error"]
    follow = inspector_call(settings, lambda i: i.get_task_info(COVERAGE_QUEUE, f"then:{task_id}"))
    assert follow.type == FINALIZE_TASK


def test_task_cancelled_by_the_inspector_marks_the_order_failed(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    service, location, task_id = order_sleeping_between_polls(start_service, settings, sim)
    inspector_call(settings, lambda i: i.cancel_task(COVERAGE_QUEUE, task_id))
    order = service.wait_status(location, "FAILED")
    assert "cancelled" in order["last_error"]


def test_covered_order_creates_no_follow_up(service: Service, sim: Sim) -> None:
    answer = service.alice.post("/orders", json=ITEMS)
    task_id = answer.json()["task_id"]
    service.wait_status(answer.headers["Location"], "COVERED")
    with pytest.raises(durq.TaskNotFoundError):
        inspector_call(
            service.settings, lambda i: i.get_task_info(COVERAGE_QUEUE, f"then:{task_id}")
        )
