"""On SQLite the order and its coverage task are written in one transaction (E8), and an
order whose coverage task is archived by any path ends FAILED (the continuation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from examples.insurance.config import Settings
from examples.insurance.store import NewOrder, SQLiteOrderStore, open_store
from examples.insurance.tasks import COVERAGE_QUEUE, FINALIZE_TASK

import durq
from insurance.kit import ITEMS, Service, Sim, counts, wait_for


def inspector_call(settings: Settings, call: Any) -> Any:
    app = durq.App(settings.broker_url)
    try:
        return app.run_sync(lambda: call(app.inspector))
    finally:
        app.close_sync()


def test_sqlite_order_and_task_in_one_transaction(service: Service, sim: Sim) -> None:
    assert service.app.state.runtime.store.transactional is True
    first = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": "one-tx"})
    assert first.status_code == 202
    again = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": "one-tx"})
    assert again.status_code == 200 and again.json()["task_id"] == first.json()["task_id"]
    assert service.wait_status(first.headers["Location"], "COVERED")["policy_number"]
    assert counts(service) == (1, 1)


async def test_sqlite_rollback_leaves_neither_order_nor_task(settings: Settings) -> None:
    app = durq.App(settings.broker_url)
    store = open_store(
        settings.database_url, "", transactional=True, broker_url=settings.broker_url
    )
    assert isinstance(store, SQLiteOrderStore) and store.transactional
    await store.open()
    await app.broker()  # the durq tables exist before a transaction writes into them
    order = NewOrder(
        id="ord_" + "0" * 24,
        customer="alice",
        idempotency_key="k",
        request_hash="h",
        items=[{"sku": "A-1", "qty": 1}],
        task_id="coverage:ord_" + "0" * 24,
    )

    async def enqueue_then_fail(connection: Any) -> Any:
        assert connection is not None  # the task joins the order's transaction (E8)
        await app.enqueue(
            "insurance:check_coverage",
            {"order_id": order.id},
            queue=COVERAGE_QUEUE,
            task_id=order.task_id,
            connection=connection,
        )
        raise RuntimeError("the handler failed after the enqueue")

    try:
        with pytest.raises(RuntimeError):
            await store.create(order, enqueue_then_fail)
        assert await store.count() == 0
        with pytest.raises(durq.TaskNotFoundError):
            await app.inspector.get_task_info(COVERAGE_QUEUE, order.task_id)
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


def test_task_archived_by_the_inspector_marks_the_order_failed(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    # The partner keeps answering "pending" and the next poll is far away: the task waits.
    sim.configure(pending_polls=1000)
    service: Service = start_service(settings.with_(backoff_base=60.0, backoff_cap=60.0))
    answer = service.alice.post("/orders", json=ITEMS)
    location, task_id = answer.headers["Location"], answer.json()["task_id"]
    wait_for(lambda: service.order(location)["task_state"] == "retry")
    assert service.order(location)["status"] == "PENDING"
    inspector_call(settings, lambda i: i.archive_task(COVERAGE_QUEUE, task_id))
    order = service.wait_status(location, "FAILED")
    assert f"coverage task {task_id} archived" in order["last_error"]
    follow = inspector_call(settings, lambda i: i.get_task_info(COVERAGE_QUEUE, f"then:{task_id}"))
    assert follow.type == FINALIZE_TASK


def test_task_cancelled_by_the_inspector_marks_the_order_failed(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    sim.configure(pending_polls=1000)
    service: Service = start_service(settings.with_(backoff_base=60.0, backoff_cap=60.0))
    answer = service.alice.post("/orders", json=ITEMS)
    location, task_id = answer.headers["Location"], answer.json()["task_id"]
    wait_for(lambda: service.order(location)["task_state"] == "retry")
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
