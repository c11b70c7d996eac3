"""The reference service's HTTP surface, attacker's view (gaps left by tests/insurance):
every route without credentials, markup in inputs never reflected as HTML, no permissive
CORS, and the HTML pages (FastAPI's docs) served with a Content-Security-Policy or not at all.

The service authenticates with a bearer token, never a cookie, so a cross-site request cannot
carry credentials: a foreign Origin gets 401 like any other anonymous caller."""

from __future__ import annotations

import sys

import pytest

from insurance.conftest import make_settings, settings, sim, sim_server, start_service  # noqa: F401
from insurance.kit import ALICE, Service

EVIL = "<script>alert(1)</script>"
ROUTES = [("POST", "/orders"), ("GET", "/orders/ord_000000000000000000000000")]


@pytest.fixture
def svc(start_service, settings) -> Service:  # noqa: F811
    return start_service(settings)


def test_every_order_route_is_401_without_credentials_even_from_a_foreign_origin(
    svc: Service,
) -> None:
    for method, path in ROUTES:
        for headers in ({}, {"Origin": "https://evil.example"}, {"Cookie": "session=1"}):
            r = svc.anon.request(method, path, json={"items": []}, headers=headers)
            assert r.status_code == 401, (method, path, headers)
            assert r.headers["content-type"].startswith("application/json")
            assert "access-control-allow-origin" not in r.headers


def test_no_permissive_cors_preflight(svc: Service) -> None:
    r = svc.anon.options(
        "/orders",
        headers={
            "Origin": "https://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-credentials" not in r.headers


@pytest.mark.parametrize(
    "body",
    [
        {"items": [{"sku": EVIL, "qty": 1}]},
        {"items": [{"sku": "A-1", "qty": EVIL}]},
        {EVIL: 1},
        {"items": EVIL},
    ],
)
def test_markup_in_input_is_never_reflected_as_html(svc: Service, body: dict) -> None:
    r = svc.alice.post("/orders", json=body)
    assert 400 <= r.status_code < 500
    assert r.headers["content-type"].startswith("application/json")
    # Whatever the error echoes is JSON-encoded data, never markup a browser would render.
    assert r.json()["error"]["code"]


def test_markup_in_path_and_headers_is_not_reflected(svc: Service) -> None:
    r = svc.alice.get(f"/orders/{EVIL}")
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/json")
    assert EVIL not in r.text
    r = svc.alice.post(
        "/orders", json={"items": [{"sku": "A-1", "qty": 1}]}, headers={"Idempotency-Key": EVIL}
    )
    assert r.status_code in (202, 400)
    assert r.headers["content-type"].startswith("application/json")


def test_html_pages_have_a_csp_or_do_not_exist(svc: Service) -> None:
    """FastAPI serves /docs and /redoc as HTML loading scripts; they must carry a CSP, or
    be switched off. Every other answer is JSON."""
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        r = svc.anon.get(path)
        if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/html"):
            assert "content-security-policy" in r.headers, f"{path} is HTML without a CSP"
    for path in ("/health", "/openapi.json"):
        r = svc.anon.get(path)
        if r.status_code == 200:
            assert r.headers["content-type"].startswith("application/json"), path


def test_every_answer_carries_the_security_headers(svc: Service) -> None:
    """The index page (HTML for a browser) and the JSON answers: no framing, no sniffing,
    no referrer, and a policy that lets the page load nothing."""
    answers = [
        svc.anon.get("/", headers={"Accept": "text/html"}),
        svc.anon.get("/health"),
        svc.anon.post("/orders", json={"items": []}),
        svc.alice.get("/orders/ord_000000000000000000000000"),
    ]
    assert answers[0].headers["content-type"].startswith("text/html")
    for r in answers:
        csp = r.headers.get("content-security-policy", "")
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, r.url
        assert r.headers.get("x-frame-options") == "DENY"
        assert r.headers.get("x-content-type-options") == "nosniff"
        assert r.headers.get("referrer-policy") == "no-referrer"


def test_authenticated_owner_sees_json_only(svc: Service) -> None:
    r = svc.alice.post("/orders", json={"items": [{"sku": "A-1", "qty": 1}]})
    assert r.status_code == 202
    status = svc.alice.get(r.headers["Location"])
    assert status.status_code == 200
    assert status.headers["content-type"].startswith("application/json")
    assert ALICE not in status.text  # the token never echoes back


@pytest.mark.parametrize("recursion_limit", [None, 50_000])
def test_deeply_nested_json_is_400_not_500(svc: Service, recursion_limit: int | None) -> None:
    """Whatever the interpreter's recursion limit (other code in the process, a test
    framework, may raise it), deep nesting is refused before validation."""
    original = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit or original)
    try:
        post_deep_bodies(svc)
    finally:
        sys.setrecursionlimit(original)


def post_deep_bodies(svc: Service) -> None:
    for body in (b"[" * 30_000, b'{"items": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"):
        r = svc.alice.post("/orders", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code in (400, 413), r.status_code
        assert r.json()["error"]["code"] in ("malformed_json", "body_too_large")
    r = svc.alice.post("/orders", content=b"[" * 30_000)
    assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json"


def test_quantities_follow_the_json_schema_integer(svc: Service) -> None:
    """JSON Schema's integer includes 137.0; strings and booleans are not integers."""
    r = svc.alice.post("/orders", json={"items": [{"sku": "A-1", "qty": 137.0}]})
    assert r.status_code == 202, r.text
    assert svc.alice.get(r.headers["Location"]).json()["items"] == [{"sku": "A-1", "qty": 137}]
    for qty in ("137", True, 1.5, 137.5):
        r = svc.alice.post("/orders", json={"items": [{"sku": "A-1", "qty": qty}]})
        assert r.status_code == 422, (qty, r.text)


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [
            r for v in node.values() for r in _refs(v)
        ]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_the_openapi_document_resolves_and_documents_every_answer(svc: Service) -> None:
    doc = svc.anon.get("/openapi.json").json()
    for ref in _refs(doc):
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            assert part in node, f"{ref} does not resolve"
            node = node[part]
    post = doc["paths"]["/orders"]["post"]["responses"]
    assert {"200", "202", "400", "401", "409", "413", "422", "503"} <= set(post)
    get = doc["paths"]["/orders/{order_id}"]["get"]["responses"]
    assert {"200", "401", "404"} <= set(get)


@pytest.mark.slow
def test_schemathesis_with_every_check_finds_nothing(svc: Service, tmp_path) -> None:
    """The reference service against its own document, every schemathesis check."""
    from fuzzkit import schemathesis_run

    run = schemathesis_run(
        f"{svc.server.url}/openapi.json",
        headers={"Authorization": f"Bearer {ALICE}"},
        max_examples=20,
        workdir=tmp_path,
    )
    assert run.generated >= 100 and run.passed == run.generated
