"""The partner's callback: real partner simulator, real API and worker, on every broker.

The simulated partner POSTs its decision to the callback URL the coverage request carried;
the service's webhook turns it into the signal the coverage task waits for. The backoff is a
minute where the callback should win, so an order that ends within seconds ended by it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from examples.insurance import partner_sim
from examples.insurance.config import Settings
from examples.insurance.tasks import COVERAGE_QUEUE

from insurance.kit import (
    ITEMS,
    PARTNER_SECRET,
    Service,
    Sim,
    inspector_call,
    migrate,
    wait_for,
)
from servers import PG_DSN, broker_url_for, drop_isolated, unique_name

CALLBACK = "/partner/callbacks/coverage"
#: A decision that comes too late to count.
LATE = {"request_id": "cov_late", "status": "rejected", "reason": "changed our mind"}


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def settings(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Iterator[Any]:
    """The test settings on each broker, without warehouses (the partner's calls are then
    the request and the polls alone) and with a minute's backoff."""
    kind = request.param
    base = settings.with_(warehouses={}, backoff_base=60.0, backoff_cap=60.0)
    if kind == "sqlite":
        yield base
        return
    url = broker_url_for(kind, tmp_path)
    migrate(url)  # as `durq migrate` does before a deploy
    if kind == "postgres":
        schema = unique_name("insurance_test")
        yield base.with_(broker_url=url, database_url=PG_DSN, database_schema=schema)
        drop_isolated("postgres", f"{PG_DSN}?schema={schema}")
    else:  # Redis: the orders in a SQLite file of their own
        yield base.with_(broker_url=url, database_url=f"sqlite:///{tmp_path / 'orders.db'}")
    drop_isolated(kind, url)


def post(service: Service) -> tuple[str, str]:
    """A new order: its location and its coverage task's id."""
    answer = service.alice.post("/orders", json=ITEMS)
    assert answer.status_code == 202, answer.text
    return str(answer.headers["Location"]), str(answer.json()["task_id"])


def steps(settings: Settings, task_id: str) -> list[tuple[str, str]]:
    """The coverage task's recorded steps: (name, what a wait is at)."""
    task = inspector_call(settings, lambda i: i.get_task_info(COVERAGE_QUEUE, task_id))
    return [(s.name, s.detail) for s in task.steps]


def call_back(service: Service, body: dict[str, Any], secret: str | None) -> httpx.Response:
    """POST a callback as the partner does, signed with ``secret`` (``None``: unsigned)."""
    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[partner_sim.SIGNATURE_HEADER] = partner_sim.sign(secret, raw)
    return service.anon.post(CALLBACK, content=raw, headers=headers)


def covered_by_the_callback(start_service: Any, settings: Settings, sim: Sim, delay: float) -> str:
    """An order the partner's callback, ``delay`` s after the request, covers with no poll
    (the first is a minute away); its coverage task's id."""
    sim.configure(pending_polls=1000, callback_delay=delay, callback_secret=PARTNER_SECRET)
    service = start_service(settings, callbacks=True)
    location, task_id = post(service)
    order = service.wait_status(location, "COVERED", task_state="completed")
    assert order["policy_number"].startswith("POL-")
    assert order["attempts"] == 0
    assert sim.stats()["calls"] == 1  # the request, and nothing else
    assert sim.stats()["callbacks"] == [200]
    assert steps(settings, task_id) == [("request", ""), ("answer-1", "received")]
    return task_id


def test_the_callback_ends_the_order_without_waiting_for_a_poll(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    task_id = covered_by_the_callback(start_service, settings, sim, delay=0.2)
    task = inspector_call(settings, lambda i: i.get_task_info(COVERAGE_QUEUE, task_id))
    assert task.snoozes == 1  # it waited, holding no worker, until the callback woke it


def test_without_a_callback_polling_still_covers_the_order(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    sim.configure(pending_polls=2, callback_copies=0, callback_secret=PARTNER_SECRET)
    fast = settings.with_(backoff_base=0.01, backoff_cap=0.05)
    service = start_service(fast, callbacks=True)
    location, task_id = post(service)
    order = service.wait_status(location, "COVERED", task_state="completed")
    assert order["attempts"] == 3  # two "pending", then the confirmation
    assert sim.stats()["callbacks"] == []
    assert [name for name, _ in steps(fast, task_id)] == [
        "request",
        *(f"{step}-{n}" for n in (1, 2, 3) for step in ("answer", "status")),
    ]
    # The callback comes after all, once the task has ended: refused, nothing changes.
    answer = call_back(service, {**LATE, "order_id": order["order_id"]}, PARTNER_SECRET)
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "task_finished"
    assert service.order(location) == order


def test_a_callback_sent_twice_has_one_outcome_and_a_late_one_changes_nothing(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    sim.configure(
        pending_polls=1000, callback_delay=0.2, callback_copies=2, callback_secret=PARTNER_SECRET
    )
    service = start_service(settings, callbacks=True)
    location, task_id = post(service)
    order = service.wait_status(location, "COVERED", task_state="completed")
    wait_for(lambda: len(sim.stats()["callbacks"]) == 2)
    assert sim.stats()["callbacks"] == [200, 200]  # delivered, then already delivered
    assert steps(settings, task_id) == [("request", ""), ("answer-1", "received")]
    # A third, later, with another decision even: taken as already delivered, nothing changes.
    late = {**LATE, "order_id": order["order_id"]}
    answer = call_back(service, late, PARTNER_SECRET)
    assert answer.status_code == 200 and answer.json()["status"] == "already_delivered"
    assert service.order(location) == order


def test_unsigned_or_badly_signed_callbacks_are_refused_and_deliver_nothing(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    sim.configure(pending_polls=1000, callback_delay=0.1, callback_secret="not-the-secret")
    service = start_service(settings, callbacks=True)
    location, task_id = post(service)
    wait_for(lambda: sim.stats()["callbacks"])
    assert sim.stats()["callbacks"] == [403]  # refused, and not sent again
    order_id = location.rsplit("/", 1)[1]
    decision = {"order_id": order_id, "request_id": "cov_x", "status": "confirmed"}
    forged = {**decision, "policy_number": "POL-FORGED"}
    for secret in (None, "", "not-the-secret"):
        answer = call_back(service, forged, secret)
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "invalid_signature"
    # Signed, but not a decision the contract allows: 422, nothing delivered either.
    assert call_back(service, decision, PARTNER_SECRET).status_code == 422
    assert call_back(service, {**decision, "status": "pending"}, PARTNER_SECRET).status_code == 422
    # Still waiting for the answer: nothing above reached the task.
    assert service.order(location)["status"] == "PENDING"
    recorded = steps(settings, task_id)
    assert [name for name, _ in recorded] == ["request", "answer-1"]
    assert recorded[1][1].startswith("waits until")
    # The real answer, signed, is still taken: the refused ones did not use up the signal.
    answer = call_back(service, {**decision, "policy_number": "POL-REAL"}, PARTNER_SECRET)
    assert answer.status_code == 200 and answer.json()["status"] == "delivered"
    assert service.wait_status(location, "COVERED")["policy_number"] == "POL-REAL"


def test_a_callback_before_the_task_waits_is_kept_for_it(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    # Delay 0: the partner calls back before it answers the request, so the signal comes
    # while the task's first attempt runs, before its first wait.
    task_id = covered_by_the_callback(start_service, settings, sim, delay=0)
    task = inspector_call(settings, lambda i: i.get_task_info(COVERAGE_QUEUE, task_id))
    assert task.snoozes == 0  # the wait found the answer kept: it never left the worker


def test_a_rejection_called_back_fails_the_order_at_once(
    start_service: Any, settings: Settings, sim: Sim
) -> None:
    sim.configure(
        pending_polls=1000,
        callback_delay=0.2,
        callback_secret=PARTNER_SECRET,
        reject_skus=["BAD-1"],
    )
    service = start_service(settings, callbacks=True)
    answer = service.alice.post("/orders", json={"items": [{"sku": "BAD-1", "qty": 1}]})
    order = service.wait_status(answer.headers["Location"], "FAILED", task_state="archived")
    assert order["last_error"] == "rejected by the insurance partner: not insurable: BAD-1"
    assert order["attempts"] == 0
