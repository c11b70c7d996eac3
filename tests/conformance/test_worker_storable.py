"""Handler-provided text every broker can store (W4, W6): error messages, tracebacks and
results holding a NUL (PostgreSQL's text refuses it) or a lone surrogate (not UTF-8 anywhere)
are recorded at once, escaped by one rule, never left active until the lease expires."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

import durq
from conformance.apps import FAST, wait_for_state
from durq.brokers import FullBroker
from durq.brokers.base import ClaimParams, CompleteParams, Lease
from durq.errors import BrokerError
from durq.states import TaskState

#: (raised message, stored message): NUL as ``\x00``, a lone surrogate as ``\ud800``.
UNSTORABLE = [
    pytest.param("a\x00b", "a\\x00b", id="nul"),
    pytest.param("a\ud800b", "a\\ud800b", id="surrogate"),
]


def _storable(text: str) -> bool:
    return "\x00" not in text and text == text.encode("utf-8", "replace").decode("utf-8")


@pytest.mark.parametrize(("raised", "stored"), UNSTORABLE)
async def test_W4_unstorable_error_is_escaped_and_archived_at_once(
    app: durq.App, raised: str, stored: str
) -> None:
    runs = Counter[str]()

    @app.task("echo:fail", max_retry=0)
    async def fail(payload: dict[str, Any]) -> None:
        runs["n"] += 1
        raise ValueError(raised)

    async with app.worker(**FAST):
        info = await fail.enqueue({})
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED, timeout=8)
    assert archived.last_error == f"ValueError: {stored}"
    assert archived.retried == 1 and runs["n"] == 1
    assert archived.traceback is not None and _storable(archived.traceback)
    assert archived.traceback.rstrip().endswith(f"ValueError: {stored}")


@pytest.mark.parametrize(("raised", "stored"), UNSTORABLE)
async def test_W4_unstorable_error_is_retried_per_policy(
    app: durq.App, raised: str, stored: str
) -> None:
    runs = Counter[str]()

    @app.task("echo:flaky", max_retry=2, retry_delay=durq.fixed(0.05))
    async def flaky(payload: dict[str, Any]) -> None:
        runs["n"] += 1
        if runs["n"] == 1:
            raise durq.NotReady(f"not yet {raised}")
        raise ValueError(raised)

    @app.task("echo:skip", max_retry=5)
    async def skip(payload: dict[str, Any]) -> None:
        raise durq.SkipRetry(f"rejected {raised}")

    async with app.worker(**FAST):
        info = await flaky.enqueue({})
        skipped = await skip.enqueue({})
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED, timeout=8)
        gave_up = await wait_for_state(app, "default", skipped.id, TaskState.ARCHIVED, timeout=8)
    assert archived.last_error == f"ValueError: {stored}"
    assert archived.retried == 3 and runs["n"] == 3
    assert gave_up.last_error == f"rejected {stored}" and gave_up.retried == 1


@pytest.mark.parametrize(("raised", "stored"), UNSTORABLE)
async def test_W4_unstorable_error_reaches_the_follow_up(
    app: durq.App, raised: str, stored: str
) -> None:
    seen: list[dict[str, Any]] = []

    @app.task("echo:charge", max_retry=0)
    async def charge(payload: dict[str, Any]) -> None:
        raise ValueError(raised)

    @app.task("echo:charge_failed")
    async def charge_failed(payload: dict[str, Any]) -> None:
        seen.append(payload)

    async with app.worker(**FAST):
        info = await charge.enqueue({}, then=durq.Then("echo:charge_failed", on_archived=True))
        await wait_for_state(app, "default", info.id, TaskState.ARCHIVED, timeout=8)
        follow_up = f"then:{info.id}"
        await wait_for_state(app, "default", follow_up, TaskState.COMPLETED, timeout=8)
    assert [p["error"] for p in seen] == [f"ValueError: {stored}"]


async def test_W6_result_with_a_nul_is_stored_as_json(app: durq.App) -> None:
    @app.task("echo:nul", retention=60)
    async def nul(payload: dict[str, Any]) -> dict[str, str]:
        return {"text": "a\x00b", "k\x00": "v"}

    async with app.worker(**FAST):
        info = await nul.enqueue({})
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED, timeout=8)
    # JSON escapes it (\u0000) and every broker stores results as bytes: read back equal.
    assert done.result == {"text": "a\x00b", "k\x00": "v"}
    assert json.loads(json.dumps(done.result)) == done.result


async def test_W6_result_with_a_lone_surrogate_fails_with_a_clear_error(app: durq.App) -> None:
    runs = Counter[str]()

    @app.task("echo:surrogate", max_retry=1, retry_delay=durq.fixed(0.05))
    async def surrogate(payload: dict[str, Any]) -> dict[str, str]:
        runs["n"] += 1
        return {"text": "a\ud800b"}

    async with app.worker(**FAST):
        info = await surrogate.enqueue({})
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED, timeout=8)
    assert archived.retried == 2 and runs["n"] == 2  # an ordinary failure: retried per policy
    assert archived.last_error is not None and _storable(archived.last_error)
    assert archived.last_error.startswith("PayloadError: result is not JSON-serialisable")
    assert "\\ud800" in archived.last_error and archived.result is None


class RefusesOneResult:
    """A real broker that refuses (BrokerError, not an outage) every call storing the
    completion of task ``bad``, the way a database refuses a value it cannot store."""

    #: No URL: the app uses this object, never a broker of its own opened from a URL.
    url = None

    def __init__(self, inner: FullBroker, bad: str) -> None:
        self._inner = inner
        self.bad = bad

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _check(self, items: Sequence[CompleteParams]) -> None:
        if any(p.lease.id == self.bad for p in items):
            raise BrokerError("refused a value it cannot store", operation="test.complete")

    async def complete(self, params: CompleteParams) -> bool:
        self._check([params])
        return await self._inner.complete(params)

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        self._check(items)
        return await self._inner.complete_many(items)

    async def complete_and_claim(
        self, items: Sequence[CompleteParams], claim: ClaimParams
    ) -> tuple[list[bool], list[Lease]]:
        self._check(items)
        return await self._inner.complete_and_claim(items, claim)  # type: ignore[attr-defined, no-any-return]


async def test_W4_a_refused_result_fails_the_attempt_and_spares_the_others(
    make_broker: Callable[..., Awaitable[FullBroker]],
) -> None:
    """A completion the broker refuses (not an outage) is not left active until its lease
    expires: sent alone, so the completions it was batched with are stored, and, refused
    again, recorded as a failure by the retry policy."""
    inner = await make_broker(fake_clock=False)
    bad_id = "refused-1"
    broker = RefusesOneResult(inner, bad_id)
    app = durq.App(broker)  # type: ignore[arg-type]

    @app.task("echo:ok", retention=60, max_retry=0)
    async def ok(payload: dict[str, Any]) -> dict[str, int]:
        return {"n": payload["n"]}

    try:
        async with app.worker(concurrency=8, **FAST):
            bad = await ok.enqueue({"n": -1}, task_id=bad_id)
            good = [await ok.enqueue({"n": n}) for n in range(20)]
            archived = await wait_for_state(app, "default", bad.id, TaskState.ARCHIVED, timeout=8)
            done = [
                await wait_for_state(app, "default", g.id, TaskState.COMPLETED, timeout=8)
                for g in good
            ]
    finally:
        await app.close()
    assert archived.retried == 1
    assert archived.last_error is not None
    assert archived.last_error.startswith("result not stored: BrokerError")
    assert "refused a value it cannot store" in archived.last_error
    assert [d.result for d in done] == [{"n": n} for n in range(20)]
