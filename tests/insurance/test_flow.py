"""The coverage flow end to end: real API, real worker, real partner simulator."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from examples.insurance.config import Settings

from insurance.kit import ITEMS, Service, Sim, wait_for


def post(service: Service, body: dict[str, Any] = ITEMS) -> str:
    answer = service.alice.post("/orders", json=body)
    assert answer.status_code == 202, answer.text
    return str(answer.headers["Location"])


def test_flow_to_covered(service: Service, sim: Sim) -> None:
    sim.configure(pending_polls=3)
    order = service.wait_status(post(service), "COVERED", task_state="completed")
    assert order["policy_number"].startswith("POL-")
    assert order["attempts"] == 4  # three "pending" answers, then the confirmation
    assert order["last_error"] is None


def test_failed_after_max_attempts_with_the_error_alert(
    start_service: Any, settings: Settings, sim: Sim, caplog: pytest.LogCaptureFixture
) -> None:
    sim.configure(pending_polls=1000)
    service = start_service(settings.with_(max_attempts=4))
    with caplog.at_level(logging.INFO, logger="durq"):
        order = service.wait_status(post(service), "FAILED")
        assert order["attempts"] == 4
        assert "gave up after 4 attempts" in order["last_error"]
        assert "pending" in order["last_error"]
        wait_for(lambda: service.order(f"/orders/{order['order_id']}")["task_state"] == "archived")
    alerts = [
        r for r in caplog.records if r.levelno == logging.ERROR and "archived" in r.getMessage()
    ]
    assert len(alerts) == 1  # one ERROR line: the alert
    assert order["task_id"] in alerts[0].getMessage()
    # "still pending" is not an error: the task waits for the partner's answer before each
    # poll (no callback offered here: each wait times out), logged at INFO.
    pending = [r for r in caplog.records if "waits for signal partner-answer" in r.getMessage()]
    assert len(pending) == 4 and all(r.levelno == logging.INFO for r in pending)


def test_rejected_by_partner_fails_without_retries(service: Service, sim: Sim) -> None:
    sim.configure(pending_polls=0, reject_skus=["BAD-1"])
    location = post(service, {"items": [{"sku": "BAD-1", "qty": 1}]})
    order = service.wait_status(location, "FAILED", task_state="archived")
    assert "rejected" in order["last_error"]
    assert order["attempts"] == 1


def test_out_of_stock_fails(service: Service, sim: Sim) -> None:
    sim.configure(stock=1)  # two warehouses: 2 units in total
    order = service.wait_status(post(service, {"items": [{"sku": "A-1", "qty": 5}]}), "FAILED")
    assert order["last_error"] == "out of stock: A-1"


def test_breaker_opens_during_an_outage_and_orders_complete_after_it(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    service = start_service(settings.with_(max_attempts=500, breaker_reset=0.5, warehouses={}))
    sim.configure(outage=True, pending_polls=0)
    locations = [post(service) for _ in range(4)]
    health = wait_for(
        lambda: (
            (h := service.anon.get("/health").json())["partners"]["insurance"]["opened"] >= 1 and h
        )
    )
    assert health["partners"]["insurance"]["breaker"] in ("open", "half_open")
    # While open, tasks fail fast without calling the partner: calls grow by probes only.
    calls = sim.stats()["calls"]
    time.sleep(0.4)
    assert sim.stats()["calls"] - calls <= 2
    for location in locations:
        order = service.order(location)
        assert order["status"] == "PENDING"
        assert "insurance unavailable" in (order["last_error"] or "")
    sim.configure(outage=False)
    for location in locations:
        assert service.wait_status(location, "COVERED")["policy_number"]
    assert service.anon.get("/health").json()["partners"]["insurance"]["breaker"] == "closed"


def test_bulkhead_bounds_concurrent_calls_per_partner(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    service = start_service(settings.with_(bulkhead=2, warehouses={}))
    sim.configure(latency=0.1, pending_polls=0)
    sim.reset_when_idle()
    locations = [post(service) for _ in range(8)]
    for location in locations:
        service.wait_status(location, "COVERED")
    stats = sim.stats()
    assert stats["calls"] >= 16
    assert stats["max_in_flight"] == 2  # concurrency 10, but never more than 2 calls at once


def test_fanout_error_names_the_unavailable_warehouse(service: Service, sim: Sim) -> None:
    sim.configure(down_warehouses=["south"], pending_polls=0)
    location = post(service)
    order = wait_for(lambda: (o := service.order(location))["last_error"] and o)
    assert order["status"] == "PENDING"
    assert "warehouse:south unavailable" in order["last_error"]
    assert "north" not in order["last_error"]
    sim.configure(down_warehouses=[])
    service.wait_status(location, "COVERED")


def test_fanout_runs_under_one_deadline(start_service: Any, settings: Settings, sim: Sim) -> None:
    service = start_service(settings.with_(fanout_timeout=0.2, call_timeout=5.0))
    sim.configure(warehouse_latency=1.0, pending_polls=0)
    started = time.monotonic()
    location = post(service)
    order = wait_for(lambda: (o := service.order(location))["last_error"] and o)
    assert time.monotonic() - started < 1.0  # the deadline, not the 5 s per-call timeout
    assert "0.2s fan-out deadline" in order["last_error"]
    assert "warehouse:north" in order["last_error"] and "warehouse:south" in order["last_error"]


def test_per_call_timeout(start_service: Any, settings: Settings, sim: Sim) -> None:
    service = start_service(settings.with_(call_timeout=0.2, warehouses={}))
    sim.configure(latency=1.0)
    location = post(service)
    order = wait_for(lambda: (o := service.order(location))["last_error"] and o)
    assert "no answer within 0.2s" in order["last_error"]


def test_monolith_shutdown_hands_running_tasks_back(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    # A poll is in flight (the partner is slow) when the process stops: the task goes back to
    # pending without losing an attempt, and nothing is lost (H5, W7).
    service = start_service(settings.with_(shutdown_timeout=0.1, warehouses={}, call_timeout=5.0))
    sim.configure(latency=2.0)
    location = post(service)
    wait_for(lambda: sim.stats()["in_flight"] >= 1)
    service.server.stop()
    import durq

    app = durq.App(settings.broker_url)
    try:
        order_id = location.rsplit("/", 1)[1]
        info = app.run_sync(
            lambda: app.inspector.get_task_info("insurance", f"coverage:{order_id}")
        )
    finally:
        app.close_sync()
    assert info.state.value == "pending"
    assert info.retried == 0
