"""The admin API's task filters (type, last error text, payload fields) and its actions on
a selection of tasks; unknown or malformed filters are a JSON 400, never ignored."""

from __future__ import annotations

import httpx
import pytest

import durq
from durq.states import TaskState

from .test_security import csrf_of, login


async def seed(app: durq.App) -> None:
    for i, partner in enumerate(["acme", "globex", "acme", "initech"]):
        await app.enqueue("email:send", {"partner": partner, "n": i}, task_id=f"e{i}")
    await app.enqueue("report:build", {"partner": "acme"}, task_id="r0", queue="default")


async def ids(api: httpx.AsyncClient, query: str) -> tuple[list[str], int]:
    r = await api.get(f"/api/queues/default/tasks?{query}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["complete"] is True
    return [t["id"] for t in body["tasks"]], body["total"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", (["e0", "e1", "e2", "e3", "r0"], 5)),
        ("type=email:send", (["e0", "e1", "e2", "e3"], 4)),
        ("type=report:build", (["r0"], 1)),
        ("payload.partner=acme", (["e0", "e2", "r0"], 3)),
        ("payload=partner%3Dacme", (["e0", "e2", "r0"], 3)),
        ("payload.partner=acme&type=email:send", (["e0", "e2"], 2)),
        ("payload.partner=acme&payload.n=2", (["e2"], 1)),
        ("payload.partner=acme&page_size=1&page=2", (["e2"], 3)),
        ("payload.partner=nobody", ([], 0)),
    ],
)
async def test_filter_by_type_and_payload(
    app: durq.App, api: httpx.AsyncClient, query: str, expected: tuple[list[str], int]
) -> None:
    await seed(app)
    assert await ids(api, query) == expected


async def test_filter_by_error_text(app: durq.App, api: httpx.AsyncClient) -> None:
    await seed(app)
    await app.inspector.cancel_task("default", "e1")  # archived, last error "cancelled"
    assert await ids(api, "state=archived&error=CANCEL") == (["e1"], 1)
    assert await ids(api, "state=archived&error=timeout") == ([], 0)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("typ=email:send", "unknown query parameter(s) 'typ'"),
        ("q=acme", "unknown query parameter(s) 'q'"),
        ("payload.bad%20field=1", "payload field"),
        ("payload=partner", "payload"),
        ("type=not%20a%20type", "type"),
        ("error=", "error"),
        ("error=" + "x" * 201, "error"),
    ],
)
async def test_a_bad_filter_is_a_json_400(
    app: durq.App, api: httpx.AsyncClient, query: str, said: str
) -> None:
    await seed(app)
    r = await api.get(f"/api/queues/default/tasks?{query}")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "bad_request"
    assert said in r.json()["error"]["message"]


async def test_act_on_a_selection(app: durq.App, api: httpx.AsyncClient) -> None:
    for i in range(3):
        await app.enqueue("email:send", {"n": i}, task_id=f"s{i}", process_in=3600)
    r = await api.post(
        "/api/queues/default/tasks:bulk",
        json={"action": "run", "ids": ["s0", "s2", "missing"]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["done"], body["failed"]) == (2, 1)
    assert [(i["id"], i["ok"], i["state"]) for i in body["results"]] == [
        ("s0", True, "pending"),
        ("s2", True, "pending"),
        ("missing", False, None),
    ]
    assert body["results"][2]["error"]["code"] == "not_found"
    stats = await app.inspector.queue_stats("default")
    assert (stats.sizes[TaskState.PENDING], stats.sizes[TaskState.SCHEDULED]) == (2, 1)

    # Archiving an archived task is refused for that task only.
    r = await api.post(
        "/api/queues/default/tasks:bulk", json={"action": "archive", "ids": ["s0", "s1"]}
    )
    r = await api.post(
        "/api/queues/default/tasks:bulk", json={"action": "archive", "ids": ["s0", "s2"]}
    )
    results = r.json()["results"]
    assert [(i["ok"], i["error"] and i["error"]["code"]) for i in results] == [
        (False, "invalid_state"),
        (True, None),
    ]
    r = await api.post(
        "/api/queues/default/tasks:bulk", json={"action": "delete", "ids": ["s0", "s1", "s2"]}
    )
    assert r.json()["done"] == 3 and all(i["state"] is None for i in r.json()["results"])
    assert (await app.inspector.queue_stats("default")).size == 0


@pytest.mark.parametrize(
    "body",
    [
        {"action": "explode", "ids": ["a"]},
        {"action": "run", "ids": []},
        {"action": "run", "ids": ["bad id"]},
        {"action": "run"},
        {"action": "run", "ids": ["a"], "extra": 1},
    ],
)
async def test_a_bad_selection_is_a_json_400(
    app: durq.App, api: httpx.AsyncClient, body: dict
) -> None:
    await seed(app)
    r = await api.post("/api/queues/default/tasks:bulk", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "bad_request"


async def test_a_selection_from_a_logged_in_browser_needs_the_csrf_token(
    app: durq.App, client: httpx.AsyncClient
) -> None:
    await seed(app)
    await login(client)
    page = await client.get("/queues/default")
    token = csrf_of(page.text)
    for headers in ({}, {"x-csrf-token": "f" * 40}):
        r = await client.post(
            "/api/queues/default/tasks:bulk",
            json={"action": "delete", "ids": ["e0"]},
            headers=headers,
        )
        assert r.status_code == 403, r.text
    r = await client.post(
        "/queues/default/selection",
        data={"csrf_token": "f" * 40, "action": "delete", "id": ["e0", "e1"]},
    )
    assert r.status_code == 403
    assert (await app.inspector.queue_stats("default")).size == 5
    # The page's own form: its token, the ticked ids.
    r = await client.post(
        "/queues/default/selection",
        data={"csrf_token": token, "action": "delete", "state": "pending", "id": ["e0", "e1"]},
    )
    assert r.status_code == 303
    assert "2 of 2 task(s) deleted" in (await client.get(r.headers["location"])).text
    assert (await app.inspector.queue_stats("default")).size == 3


async def test_encrypted_payloads_are_opaque_to_search_and_display(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    from durq.encryption import Encryption

    app.encryption = Encryption({"k1": Encryption.new_key()})
    await app.enqueue("email:send", {"partner": "acme-secret"}, task_id="s0")
    r = await api.get("/api/queues/default/tasks?payload.partner=acme-secret")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("payloads are encrypted: a search cannot")
    page = await api.get("/queues/default?payload.partner=acme-secret")
    assert page.status_code == 400 and "payloads are encrypted" in page.text
    assert await ids(api, "type=email:send") == (["s0"], 1)  # other filters still work
    listed = (await api.get("/api/queues/default/tasks")).json()["tasks"]
    assert listed[0]["payload_preview"] == "encrypted"
    one = await api.get("/api/queues/default/tasks/s0")
    assert one.status_code == 200 and one.json()["payload"] == "encrypted"
    html = (await api.get("/queues/default/tasks/s0")).text
    assert "(encrypted)" in html and "acme-secret" not in html and "durq:encrypted" not in html
