"""The plain enqueue (a type and a payload, no option) takes a path of its own: it must give
the params the general path gives, and step aside whenever the general path does more."""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic
import pytest

import durq
from durq.options import make_request


class Charge(pydantic.BaseModel):
    amount: int
    currency: str = "EUR"


def _app() -> durq.App:
    app = durq.App("memory://", default_queue="main")

    @app.task("plain")
    async def plain(payload: dict[str, Any]) -> None: ...

    @app.task("tuned", queue="slow", max_retry=3, timeout="90s", retention=0, priority=7)
    async def tuned(payload: dict[str, Any]) -> None: ...

    @app.task("typed")
    async def typed(payload: Charge) -> None: ...

    @app.task("unique", unique=60)
    async def unique(payload: dict[str, Any]) -> None: ...

    @app.task("limited", limit=durq.Limit("acct", concurrency=1))
    async def limited(payload: dict[str, Any]) -> None: ...

    return app


@pytest.mark.parametrize(
    ("task_type", "payload"),
    [
        ("plain", {"i": 1}),
        ("plain", None),
        ("tuned", {"nested": {"b": [1, 2], "a": "é"}}),
        ("typed", Charge(amount=5)),
        ("typed", {"amount": 5}),
        ("not-registered", {"i": 1}),
    ],
)
def test_plain_params_are_the_general_paths(task_type: str, payload: Any) -> None:
    app = _app()
    plain = app._plain(task_type)
    assert plain is not None
    fast = plain.params(payload, app.max_payload)
    general = app.params(make_request(type=task_type, payload=payload))
    assert dataclasses.replace(fast, id=general.id) == general
    assert len(fast.id) == 32 and fast.id != plain.params(payload, app.max_payload).id


@pytest.mark.parametrize("task_type", ["unique", "limited", "durq:webhook", "bad name!"])
def test_types_whose_enqueue_reads_more_take_the_general_path(task_type: str) -> None:
    assert _app()._plain(task_type) is None


def test_hooks_and_encryption_take_the_general_path() -> None:
    app = _app()
    assert app._plain("plain") is not None
    app.header_hooks.append(lambda headers: headers.update({"x": "1"}))
    assert app._plain("plain") is None
    sealed = durq.App("memory://", encryption=durq.Encryption({"k1": durq.Encryption.new_key()}))
    assert sealed._plain("anything") is None


def test_payload_errors_are_the_general_paths() -> None:
    app = _app()
    plain = app._plain("typed")
    assert plain is not None
    with pytest.raises(durq.PayloadError):
        plain.params({"amount": "lots"}, app.max_payload)
    other = app._plain("plain")
    assert other is not None
    with pytest.raises(durq.PayloadError):
        other.params({"blob": "a" * 200}, 100)
    with pytest.raises(durq.PayloadError):
        other.params([1, 2], app.max_payload)


async def test_a_type_registered_after_its_first_enqueue_takes_its_options() -> None:
    app = durq.App("memory://")
    try:
        first = await app.enqueue("late", {"i": 1})
        assert first.queue == "default"

        @app.task("late", queue="elsewhere", priority=3)
        async def late(payload: dict[str, Any]) -> None: ...

        second = await app.enqueue("late", {"i": 2})
        assert (second.queue, second.priority) == ("elsewhere", 3)
        app.default_queue = "moved"
        assert (await app.enqueue("unregistered", {})).queue == "moved"
    finally:
        await app.close()


async def test_the_plain_call_runs_send_and_enqueue_hooks() -> None:
    app = _app()
    seen: list[str] = []
    app.enqueue_hooks.append(lambda info: seen.append(info.id))
    try:
        info = await app.enqueue("plain", {"i": 1})
        assert seen == [info.id]
        again = await app.enqueue("plain", {"i": 1})
        assert again.id != info.id and seen == [info.id, again.id]
    finally:
        await app.close()
