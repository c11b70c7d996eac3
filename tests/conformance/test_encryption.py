"""Payload and result encryption on every broker: the broker stores only ciphertext, the
handler and the enqueuer see plain data, older keys stay readable, a missing key archives
the task with a clear error, and follow-ups and group fan-ins carry sealed values through."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durq
from conformance.apps import FAST, wait_for_state
from durq import encryption as crypt
from durq.encryption import Encryption
from durq.errors import ValidationError
from durq.inspector import ENCRYPTED_SEARCH, task_filter
from durq.states import TaskState

K1 = Encryption.new_key()
K2 = Encryption.new_key()
SECRET = "4111-1111-1111-1111"


async def test_round_trip_stores_only_ciphertext(app: durq.App) -> None:
    app.encryption = Encryption({"k1": K1})
    seen: list[dict[str, Any]] = []

    @app.task("card:charge", retention=60)
    async def charge(payload: dict[str, Any]) -> dict[str, Any]:
        seen.append(payload)
        return {"receipt": f"paid {payload['card']}"}

    info = await charge.enqueue({"card": SECRET})
    assert info.payload == {"card": SECRET}  # the enqueuer gets back what it gave
    stored = await app.inspector.get_task_info("default", info.id)
    assert stored.encrypted and crypt.key_id(stored.raw_payload) == "k1"
    assert SECRET.encode() not in stored.raw_payload
    assert stored.to_dict()["payload"] == "encrypted"
    assert stored.summary()["payload_preview"] == "encrypted"
    async with app.worker(**FAST):
        result = await app.wait(info, timeout=10)
    assert seen == [{"card": SECRET}]
    assert result == {"receipt": f"paid {SECRET}"}
    done = await app.inspector.get_task_info("default", info.id)
    assert done.raw_result is not None and crypt.sealed(done.raw_result)
    assert SECRET.encode() not in done.raw_result
    assert done.to_dict()["result"] == "encrypted"
    opened = app.decrypted(done)  # for code that reads tasks with the app's keys
    assert opened.payload == {"card": SECRET}
    assert opened.result == {"receipt": f"paid {SECRET}"}
    with pytest.raises(durq.EncryptionError, match="no keys are configured"):
        durq.App("memory://").decrypted(done)


async def test_older_key_stays_readable_and_new_writes_use_the_newest(app: durq.App) -> None:
    app.encryption = Encryption({"k1": K1})
    seen: list[dict[str, Any]] = []

    @app.task("doc:sign", retention=60)
    def sign(payload: dict[str, Any]) -> str:
        seen.append(payload)
        return "signed"

    old = await sign.enqueue({"doc": 1})
    app.encryption = Encryption({"k2": K2, "k1": K1})  # k2 rotated in, k1 still listed
    new = await sign.enqueue({"doc": 2})
    assert crypt.key_id((await app.inspector.get_task_info("default", new.id)).raw_payload) == "k2"
    async with app.worker(**FAST):
        assert await app.wait(old, timeout=10) == "signed"
        assert await app.wait(new, timeout=10) == "signed"
    assert sorted(p["doc"] for p in seen) == [1, 2]
    done = await app.inspector.get_task_info("default", old.id)
    assert crypt.key_id(done.raw_result or b"") == "k2"


@pytest.mark.parametrize("keys", [None, {"k3": Encryption.new_key()}], ids=["no-keys", "other"])
async def test_missing_key_archives_with_a_clear_error(
    app: durq.App, keys: dict[str, str] | None
) -> None:
    app.encryption = Encryption({"k1": K1})
    calls: list[Any] = []

    @app.task("card:charge", max_retry=5)
    def charge(payload: dict[str, Any]) -> None:
        calls.append(payload)

    info = await charge.enqueue({"card": SECRET})
    app.encryption = None if keys is None else Encryption(keys)
    async with app.worker(**FAST):
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert calls == []  # never handed ciphertext, and not retried
    assert archived.last_error is not None
    assert archived.last_error.startswith("payload decryption error:")
    assert "k1" in archived.last_error
    with pytest.raises(durq.EncryptionError):
        crypt.decode(archived.raw_payload, app.encryption)


async def test_follow_up_gets_the_plain_payload_and_result(app: durq.App) -> None:
    app.encryption = Encryption({"k1": K1})
    got: list[dict[str, Any]] = []
    done = asyncio.Event()

    @app.task("pdf:render", retention=60)
    async def render(payload: dict[str, Any]) -> dict[str, Any]:
        return {"secret": payload["secret"] * 2}

    @app.task("mail:send", retention=60)
    async def send(payload: dict[str, Any]) -> None:
        got.append(payload)
        done.set()

    # A space is not base64: sealed bytes never contain the value by chance ("abc" once did).
    info = await render.enqueue({"secret": "a b"}, then="mail:send")
    async with app.worker(**FAST):
        await asyncio.wait_for(done.wait(), 10)
    (payload,) = got
    assert payload["payload"] == {"secret": "a b"} and payload["result"] == {"secret": "a ba b"}
    follow = await app.inspector.get_task_info("default", f"then:{info.id}")
    assert b"a b" not in follow.raw_payload  # the parent's values travel sealed
    assert follow.payload["task"]["id"] == info.id  # task metadata stays readable


async def test_group_fan_in_opens_member_results(app: durq.App) -> None:
    app.encryption = Encryption({"k1": K1})
    got: list[dict[str, Any]] = []
    done = asyncio.Event()

    @app.task("part:make")
    def make(payload: dict[str, Any]) -> dict[str, Any]:
        return {"part": f"secret-{payload['n']}"}

    @app.task("part:merge", retention=60)
    def merge(payload: dict[str, Any]) -> None:
        got.append(payload)
        done.set()

    group = await app.enqueue_group([make.request({"n": n}) for n in range(3)], then="part:merge")
    async with app.worker(**FAST):
        await asyncio.wait_for(done.wait(), 10)
    (payload,) = got
    assert [m["result"] for m in payload["members"]] == [{"part": f"secret-{n}"} for n in range(3)]
    assert group.then_id is not None
    follow = await app.inspector.get_task_info("default", group.then_id)
    assert b"secret-" not in follow.raw_payload


async def test_search_says_it_cannot_look_into_encrypted_payloads(app: durq.App) -> None:
    app.encryption = Encryption({"k1": K1})
    await app.enqueue("card:charge", {"card": SECRET})
    with pytest.raises(ValidationError, match="payloads are encrypted") as caught:
        await app.inspector.search_tasks(
            "default", "pending", task_filter(payload=[("card", SECRET)])
        )
    assert caught.value.message == ENCRYPTED_SEARCH
    found = await app.inspector.search_tasks("default", "pending", task_filter(type="card:charge"))
    assert found.total == 1 and found.tasks[0].encrypted
