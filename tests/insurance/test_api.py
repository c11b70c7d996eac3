"""The HTTP contract of the reference service, through real HTTP (uvicorn on loopback)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from examples.insurance.config import Settings

from insurance.kit import ITEMS, Service, counts, saved


@pytest.fixture
def service(shared_service: Service) -> Service:
    """One API for this module: these tests only read answers (what they saved is compared before and after).
    The simulator is not reset in between: it would forget the coverage requests of earlier
    orders, whose tasks would then fail and add follow-up tasks during a later count."""
    return shared_service


def key() -> str:
    return uuid.uuid4().hex


def test_post_answers_202_with_location_then_200_already_accepted(service: Service) -> None:
    """H1, H2 through real HTTP: a retried request creates nothing and gets 200."""
    before = saved(service)
    k = key()
    first = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": k})
    assert first.status_code == 202
    body = first.json()
    assert body["status"] == "queued" and body["queue"] == "insurance"
    location = first.headers["Location"]
    assert location == f"/orders/{body['order_id']}"
    assert body["task_id"] == f"coverage:{body['order_id']}"

    again = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": k})
    assert again.status_code == 200
    assert again.json()["status"] == "already_accepted"
    assert again.json()["task_id"] == body["task_id"]
    assert again.headers["Location"] == location
    assert saved(service) == (before[0] + 1, [])  # the repeat created nothing


def test_same_key_other_customer_is_another_order(service: Service) -> None:
    k = key()
    a = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": k})
    b = service.bob.post("/orders", json=ITEMS, headers={"Idempotency-Key": k})
    assert a.status_code == b.status_code == 202
    assert a.json()["order_id"] != b.json()["order_id"]


def test_key_reused_with_another_body_is_409(service: Service) -> None:
    k = key()
    assert (
        service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": k}).status_code == 202
    )
    other = {"items": [{"sku": "B-2", "qty": 1}]}
    before = saved(service)
    answer = service.alice.post("/orders", json=other, headers={"Idempotency-Key": k})
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "idempotency_key_reused"
    assert saved(service) == before


def test_without_key_every_post_is_a_new_order(service: Service) -> None:
    ids = {service.alice.post("/orders", json=ITEMS).json()["order_id"] for _ in range(3)}
    assert len(ids) == 3


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "unauthorized"),
        ({"Authorization": "Bearer nope"}, "unauthorized"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "unauthorized"),
    ],
)
def test_401_without_a_valid_token(service: Service, headers: dict[str, str], code: str) -> None:
    before = saved(service)
    answer = service.anon.post("/orders", json=ITEMS, headers=headers)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == code
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert (
        service.anon.get("/orders/ord_000000000000000000000000", headers=headers).status_code == 401
    )
    assert saved(service) == before


def test_status_only_for_the_owner(service: Service) -> None:
    """H4: status is decided by owning the order; a task id opens nothing."""
    created = service.alice.post("/orders", json=ITEMS)
    location = created.headers["Location"]
    assert service.alice.get(location).status_code == 200
    other = service.bob.get(location)
    assert other.status_code == 404  # not 403: the id is not a password
    assert other.json()["error"]["code"] == "not_found"
    # Knowing the task id does not help either.
    task_id = created.json()["task_id"]
    assert service.bob.get(f"/orders/{task_id}").status_code == 404


@pytest.mark.parametrize(
    "path", ["/orders/ord_ffffffffffffffffffffffff", "/orders/nope", "/orders/..%2f"]
)
def test_unknown_order_is_404_json(service: Service, path: str) -> None:
    """H3: a status request for an unknown order is 404, never "pending"."""
    answer = service.alice.get(path)
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


BAD_BODIES: list[tuple[str, bytes, int, str]] = [
    ("malformed json", b'{"items": [', 400, "malformed_json"),
    ("not json at all", b"items=1", 400, "malformed_json"),
    ("empty body", b"", 400, "malformed_json"),
    ("missing items", b"{}", 422, "invalid_order"),
    ("items not a list", b'{"items": "A-1"}', 422, "invalid_order"),
    ("empty items", b'{"items": []}', 422, "invalid_order"),
    ("qty as string", b'{"items": [{"sku": "A-1", "qty": "2"}]}', 422, "invalid_order"),
    ("qty zero", b'{"items": [{"sku": "A-1", "qty": 0}]}', 422, "invalid_order"),
    ("sku as number", b'{"items": [{"sku": 5, "qty": 1}]}', 422, "invalid_order"),
    ("bad sku", b'{"items": [{"sku": "a b;--", "qty": 1}]}', 422, "invalid_order"),
    (
        "unknown field",
        b'{"items": [{"sku": "A-1", "qty": 1}], "admin": true}',
        422,
        "invalid_order",
    ),
    ("json array", b"[1, 2]", 422, "invalid_order"),
]


@pytest.mark.parametrize(
    ("name", "body", "status", "code"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES]
)
def test_bad_input_is_4xx_json_and_nothing_is_saved(
    service: Service, name: str, body: bytes, status: int, code: str
) -> None:
    before = saved(service)
    answer = service.alice.post(
        "/orders",
        content=body,
        headers={"Content-Type": "application/json", "Idempotency-Key": key()},
    )
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code and error["message"]
    assert saved(service) == before


def test_huge_body_is_413(service: Service) -> None:
    before = saved(service)
    items = [{"sku": "A-1", "qty": 1}] * 20_000  # ~500 KB, above the 64 KiB limit
    answer = service.alice.post("/orders", content=json.dumps({"items": items}).encode())
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "body_too_large"

    def chunks() -> Any:  # no Content-Length: the limit holds while streaming too
        for _ in range(100):
            yield b" " * 4096

    streamed = service.alice.post("/orders", content=chunks())
    assert streamed.status_code == 413
    assert saved(service) == before


def test_bad_idempotency_key_is_400(service: Service) -> None:
    before = saved(service)
    answer = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": "x" * 201})
    assert answer.status_code == 400
    assert saved(service) == before


def test_503_with_retry_after_when_the_broker_is_down(
    start_service: Any, settings: Settings, tmp_path: Path
) -> None:
    """H3: broker down is 503 with Retry-After, and nothing stays half-done."""
    # A broker that cannot be opened (its directory does not exist), the API split from the
    # worker: the API still starts and answers, and saves nothing.
    down = settings.with_(
        broker_url=f"sqlite:///{tmp_path / 'missing' / 'durq.sqlite3'}", monolith=False
    )
    svc = start_service(down)
    answer = svc.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": "k"})
    assert answer.status_code == 503
    assert answer.headers["Retry-After"].isdigit()
    assert answer.json()["error"]["code"] == "broker_unavailable"
    health = svc.anon.get("/health")
    assert health.status_code == 503 and health.json()["broker"]["ok"] is False
    orders, _ = counts(down.with_(broker_url=settings.broker_url))
    assert orders == 0  # the compensation removed the order saved before the enqueue


def test_health_probe_is_cached(service: Service) -> None:
    probe = service.app.state.probe
    probe.ttl = 60.0
    first = service.anon.get("/health").json()
    pings = probe.pings
    second = service.anon.get("/health").json()
    assert first["status"] == "ok" and second["status"] == "ok"
    assert second["broker"]["cached"] is True
    assert probe.pings == pings  # the second probe cost no ping
    assert first["partners"]["insurance"]["breaker"] == "closed"


def test_openapi_documents_the_service(service: Service) -> None:
    doc = service.anon.get("/openapi.json").json()
    assert {"/orders", "/orders/{order_id}", "/health"} <= set(doc["paths"])
    assert "202" in doc["paths"]["/orders"]["post"]["responses"]


def test_root_points_to_the_endpoints_and_the_docs(service: Service) -> None:
    as_json = service.anon.get("/")
    assert as_json.status_code == 200
    assert as_json.headers["content-type"].startswith("application/json")
    endpoints = as_json.json()["endpoints"]
    assert {"POST /orders", "GET /orders/{order_id}", "GET /health"} <= set(endpoints)
    assert "durq dash" in as_json.json()["docs"]["dashboard"]

    page = service.anon.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<a href="/openapi.json">' in page.text and "POST /orders" in page.text
    assert "/" not in service.anon.get("/openapi.json").json()["paths"]
