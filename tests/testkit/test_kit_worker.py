"""The testing kit's worker on every broker: real executor outcomes, time moved by the test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

import durq
import durq.testing
from durq.clock import SYSTEM_CLOCK, FakeClock
from durq.states import TaskState


async def migrated(broker_url: str, **options: Any) -> durq.App:
    application = durq.App(broker_url, **options)
    migrator = application.new_broker()
    await migrator.migrate()
    await migrator.close()
    return application


@pytest.fixture
async def app(broker_url: str) -> AsyncIterator[durq.App]:
    """An App on isolated storage of each broker, with the real clock (the kit swaps it)."""
    application = await migrated(broker_url)
    yield application
    await application.close()


async def test_retries_happen_when_the_clock_says_so(app: durq.App) -> None:
    @app.task("t:poll", max_retry=5, retry_delay=lambda n, e: 60)
    async def poll(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
        if ctx.retried < 2:
            raise durq.NotReady("partner still working")
        return {"ok": True, "n": payload["n"]}

    async with durq.testing.worker(app) as w:
        info = await app.enqueue("t:poll", {"n": 7}, process_in="1h")
        assert await w.drain() == []
        w.clock.advance("59m")
        assert await w.drain() == []
        w.clock.advance("1m")
        first = await w.drain()
        assert first.outcomes == [("t:poll", "retry")]
        assert isinstance(first[0].error, durq.NotReady)
        assert (await w.get(info)).state is TaskState.RETRY
        w.clock.advance(59)
        assert await w.drain() == []
        w.clock.advance(1)
        assert (await w.drain()).outcomes == [("t:poll", "retry")]
        w.clock.advance(60)
        last = await w.drain()
        assert last.outcomes == [("t:poll", "completed")]
        assert last[0].result == {"ok": True, "n": 7}
        assert last[0].number == 3
        done = await app.inspector.get_task_info(info.queue, info.id)
        assert done.state is TaskState.COMPLETED and done.retried == 2
        assert done.result == {"ok": True, "n": 7}
    assert app.clock is SYSTEM_CLOCK  # given back


async def test_a_handler_error_fails_the_drain_with_its_traceback(app: durq.App) -> None:
    @app.task("t:buggy", max_retry=1, retry_delay=lambda n, e: 0)
    def buggy(payload: dict[str, Any]) -> None:
        ratio = payload["a"] / payload["b"]  # the line the traceback must show
        print(ratio)

    async with durq.testing.worker(app) as w:
        info = await app.enqueue("t:buggy", {"a": 1, "b": 0})
        with pytest.raises(durq.testing.TaskFailedError) as caught:
            await w.drain()
        message = str(caught.value)
        assert "ZeroDivisionError: division by zero" in message
        assert 'ratio = payload["a"] / payload["b"]' in message
        assert "attempt 1 -> retry" in message and "attempt 2 -> archived" in message
        # The drain still ran everything due; the task is archived, as a worker leaves it.
        stored = await w.get(info)
        assert stored.state is TaskState.ARCHIVED
        assert stored.last_error == "ZeroDivisionError: division by zero"
        assert "ZeroDivisionError" in (w.traceback(info) or "")


async def test_failures_can_be_looked_at_instead_of_raised(app: durq.App) -> None:
    @app.task("t:skip")
    async def skip(payload: dict[str, Any]) -> None:
        raise durq.SkipRetry("invalid order")

    @app.task("t:boom", max_retry=0)
    async def boom(payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    async with durq.testing.worker(app) as w:
        await app.enqueue("t:skip", {})
        await app.enqueue("t:boom", {})
        ran = await w.drain(raise_errors=False)
        assert sorted(ran.outcomes) == [("t:boom", "archived"), ("t:skip", "archived")]
        assert [a.type for a in ran.errors] == ["t:boom"]  # SkipRetry is on purpose
        assert "RuntimeError: boom" in (ran.of("t:boom")[0].traceback or "")
        archived = await w.tasks(state="archived")
        assert sorted(t.last_error or "" for t in archived) == [
            "RuntimeError: boom",
            "invalid order",
        ]


async def test_a_task_with_no_handler_is_reported(app: durq.App) -> None:
    async with durq.testing.worker(app) as w:
        await app.enqueue("t:nobody", {}, max_retry=0)
        with pytest.raises(durq.testing.TaskFailedError, match='no handler for type "t:nobody"'):
            await w.drain()


class Order(BaseModel):
    order_id: int
    sku: str


async def test_payloads_round_trip_through_the_codec(app: durq.App) -> None:
    seen: list[Order] = []

    @app.task("t:order")
    async def take(order: Order) -> tuple[int, str]:
        seen.append(order)
        return (order.order_id, order.sku)

    async with durq.testing.worker(app) as w:
        with pytest.raises(durq.PayloadError):
            await app.enqueue("t:order", {"order_id": "not a number", "sku": "A"})
        with pytest.raises(durq.PayloadError):
            await app.enqueue("t:order", {"order_id": 1, "sku": object()})
        await app.enqueue("t:order", Order(order_id=1, sku="A-1"))
        ran = await w.drain()
        assert seen == [Order(order_id=1, sku="A-1")]
        assert ran[0].result == [1, "A-1"]  # JSON: a tuple comes back as a list


async def test_options_are_honoured(app: durq.App) -> None:
    started = asyncio.Event()

    @app.task("t:slow", timeout=0.05, max_retry=0)
    async def slow(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(30)

    @app.task("t:once", unique="1h")
    async def once(payload: dict[str, Any]) -> None:
        return None

    async with durq.testing.worker(app) as w:
        await app.enqueue("t:once", {"k": 1})
        with pytest.raises(durq.DuplicateTaskError):
            await app.enqueue("t:once", {"k": 1})
        await app.enqueue("t:slow", {})
        ran = await w.drain(raise_errors=False)
        assert sorted(ran.outcomes) == [("t:once", "completed"), ("t:slow", "archived")]
        assert started.is_set()
        assert ran.of("t:slow")[0].message == "timeout after 0.05s"


async def test_continuations_run_in_the_same_drain(app: durq.App) -> None:
    got: list[dict[str, Any]] = []

    @app.task("pdf:render")
    async def render(payload: dict[str, Any]) -> dict[str, Any]:
        return {"pages": 3}

    @app.task("email:send_pdf")
    async def send(payload: dict[str, Any]) -> None:
        got.append(payload)

    async with durq.testing.worker(app) as w:
        info = await app.enqueue("pdf:render", {"doc": 9}, then="email:send_pdf")
        ran = await w.drain()
        assert ran.outcomes == [("pdf:render", "completed"), ("email:send_pdf", "completed")]
    assert got[0]["task"]["id"] == info.id
    assert got[0]["payload"] == {"doc": 9} and got[0]["result"] == {"pages": 3}


async def test_a_drain_that_never_ends_stops_at_its_limit(app: durq.App) -> None:
    @app.task("t:again")
    async def again(payload: dict[str, Any]) -> None:
        await app.enqueue("t:again", {"n": payload["n"] + 1})

    async with durq.testing.worker(app) as w:
        await app.enqueue("t:again", {"n": 0})
        with pytest.raises(durq.testing.DrainLimitError) as caught:
            await w.drain(limit=5)
        assert len(caught.value.pending) == 1
        assert "t:again" in str(caught.value) and "still due" in str(caught.value)
        assert [t.payload["n"] for t in caught.value.pending] == [5]


async def test_periodic_ticks_follow_the_clock(app: durq.App) -> None:
    ticks: list[str] = []

    @app.periodic("@every 10m", type="t:tick")
    async def tick(ctx: durq.TaskContext) -> None:
        ticks.append(ctx.id)

    # A whole multiple of 10 minutes: the first tick is due at once.
    async with durq.testing.worker(app, start=1_800_000_000.0, scheduler=True) as w:
        assert [a.type for a in await w.drain()] == ["t:tick"]
        w.clock.advance("9m")
        assert await w.drain() == []
        w.clock.advance("1m")
        assert [a.type for a in await w.drain()] == ["t:tick"]
    assert ticks == ["periodic:t:tick:1800000000", "periodic:t:tick:1800000600"]


async def test_schedules_stay_quiet_unless_the_worker_runs_them(app: durq.App) -> None:
    @app.periodic("@every 5s", type="health:ping")
    async def ping() -> None: ...

    @app.task("t:work")
    async def work() -> None: ...

    async with durq.testing.worker(app, start=1_800_000_000.0) as w:
        await app.enqueue("t:work")
        assert (await w.drain()).outcomes == [("t:work", "completed")]
        w.clock.advance("1h")
        assert await w.drain() == []
    async with durq.testing.worker(app, start=1_800_000_000.0, scheduler=True) as w:
        assert (await w.drain()).outcomes == [("health:ping", "completed")]


async def test_tasks_filters_by_type_queue_and_state(app: durq.App) -> None:
    @app.task("a:one")
    async def one(payload: dict[str, Any]) -> None:
        return None

    @app.task("b:two", queue="low")
    async def two(payload: dict[str, Any]) -> None:
        return None

    async with durq.testing.worker(app) as w:
        await app.enqueue("a:one", {})
        await app.enqueue("b:two", {}, process_in="1h")
        await app.enqueue("b:two", {})
        await w.drain()
        assert [t.type for t in await w.tasks(state="completed")] == ["a:one", "b:two"]
        assert [t.state for t in await w.tasks(type="b:two")] == [
            TaskState.SCHEDULED,
            TaskState.COMPLETED,
        ]
        assert [t.type for t in await w.tasks(queue="default")] == ["a:one"]
        assert await w.tasks(type="b:two", state=["pending", "retry"]) == []


async def test_completed_tasks_can_be_deleted_as_in_production(app: durq.App) -> None:
    @app.task("t:quick", retention=0)  # deleted on success: nothing kept in production
    async def quick(payload: dict[str, Any]) -> int:
        return 1

    async with durq.testing.worker(app, keep_completed=False) as w:
        info = await app.enqueue("t:quick", {})
        assert [a.result for a in await w.drain()] == [1]
        with pytest.raises(durq.TaskNotFoundError):
            await w.get(info)
        again = await app.enqueue("t:quick", {}, task_id=info.id)  # the id is free again
        assert again.id == info.id


async def test_an_app_built_with_a_fake_clock_keeps_it(broker_url: str) -> None:
    clock = FakeClock(1_900_000_000.0)
    app = await migrated(broker_url, clock=clock)
    try:
        async with durq.testing.worker(app) as w:
            assert w.clock is clock
            info = await app.enqueue("t:any", {})
            assert info.enqueued_at is not None
            assert info.enqueued_at.timestamp() == 1_900_000_000.0
        assert app.clock is clock
    finally:
        await app.close()


async def test_encrypted_tasks_run_and_report_plain_results(broker_url: str) -> None:
    """With encryption on, the kit's attempts carry the result the handler returned, not
    its ciphertext; the stored task holds only ciphertext."""
    from durq.encryption import Encryption

    app = await migrated(broker_url, encryption=Encryption({"k1": Encryption.new_key()}))

    @app.task("t:secret", retention=60)
    def secret(payload: dict[str, Any]) -> dict[str, Any]:
        return {"echo": payload["pin"]}

    try:
        async with durq.testing.worker(app) as w:
            info = await app.enqueue("t:secret", {"pin": "1234"})
            done = await w.drain()
            assert done.outcomes == [("t:secret", "completed")]
            assert done[0].result == {"echo": "1234"}
            stored = await w.get(info)
            assert stored.encrypted and b"1234" not in (stored.raw_result or b"")
    finally:
        await app.close()


async def test_steps_and_snoozes_run_under_drain(app: durq.App) -> None:
    charged: list[str] = []

    def charge(order: str) -> str:
        charged.append(order)
        return f"ch_{order}"

    @app.task("t:order", max_retry=5, retry_delay=lambda n, e: 60)
    async def order(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        charge_id = await ctx.step("charge", charge, payload["order"])
        if ctx.attempt == 1:
            raise durq.NotReady("mail server busy")
        if not await ctx.step("stock", lambda: payload.get("stock", False)):
            ctx.snooze("5m", "waiting for stock")
        return str(charge_id)

    async with durq.testing.worker(app) as w:
        info = await app.enqueue("t:order", {"order": "o1"})
        assert (await w.drain()).outcomes == [("t:order", "retry")]
        w.clock.advance(60)
        assert (await w.drain()).outcomes == [("t:order", "snoozed")]
        task = await w.get(info)
        assert (task.state, task.retried, task.snoozes) == (TaskState.SCHEDULED, 1, 1)
        assert [s.name for s in task.steps] == ["charge", "stock"]
        w.clock.advance("5m")
        # The recorded "stock" step says False again: steps are for work done, not polls.
        assert (await w.drain()).outcomes == [("t:order", "snoozed")]
    assert charged == ["o1"]


async def test_durable_sleeps_pass_on_the_test_clock(app: durq.App) -> None:
    done: list[str] = []

    @app.task("t:cool_off")
    async def cool_off(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        await ctx.step("check", lambda: done.append("check"))
        await ctx.sleep("cool-off", "1h")
        await ctx.step("issue", lambda: done.append("issue"))
        return "issued"

    async with durq.testing.worker(app) as w:
        info = await app.enqueue("t:cool_off", {})
        assert (await w.drain()).outcomes == [("t:cool_off", "slept")]
        w.clock.advance("59m")
        assert (await w.drain()).outcomes == []
        w.clock.advance("1m")
        drained = await w.drain()
        assert drained.outcomes == [("t:cool_off", "completed")]
        assert drained[0].result == "issued"
        task = await w.get(info)
        assert [s.name for s in task.steps] == ["check", "cool-off", "issue"]
    assert done == ["check", "issue"]


async def test_signals_are_delivered_under_drain(app: durq.App) -> None:
    @app.task("t:approval")
    async def approval(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        try:
            decision = await ctx.wait_for("approved", timeout="1d")
        except durq.SignalTimeoutError:
            return "expired"
        return f"approved by {decision['by']}"

    async with durq.testing.worker(app) as w:
        first = await app.enqueue("t:approval", {})
        second = await app.enqueue("t:approval", {})
        assert (await w.drain()).outcomes == [("t:approval", "slept"), ("t:approval", "slept")]
        assert await app.signal(first, "approved", {"by": "ann"}) is True
        drained = await w.drain()
        assert drained.outcomes == [("t:approval", "completed")]
        assert drained[0].result == "approved by ann"
        # The other one's wait ends at its timeout, on the test's clock.
        w.clock.advance("1d")
        drained = await w.drain()
        assert [(a.id, a.result) for a in drained] == [(second.id, "expired")]


async def test_one_signal_awaited_by_several_waits_each_its_own_step(app: durq.App) -> None:
    polls: list[str] = []

    async def poll(ctx: durq.TaskContext, n: int, answer_meanwhile: bool) -> None:
        polls.append(f"{ctx.id}:{n}")
        if answer_meanwhile:  # the signal comes while the task runs: kept for the next wait
            assert await app.signal(ctx.id, "answer", "kept") is True

    @app.task("t:callback_or_poll")
    async def callback_or_poll(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        for n in range(1, 4):
            try:
                answer = await ctx.wait_for("answer", timeout="1h", step=f"wait-{n}")
            except durq.SignalTimeoutError:
                await ctx.step(f"poll-{n}", poll, ctx, n, payload["meanwhile"])
                continue
            return f"{answer} after {n - 1} polls"
        return "no answer"

    async with durq.testing.worker(app) as w:
        woken = await app.enqueue("t:callback_or_poll", {"meanwhile": False}, task_id="woken")
        assert (await w.drain()).outcomes == [("t:callback_or_poll", "slept")]
        w.clock.advance("1h")  # the first wait times out: a poll, then the next wait
        assert (await w.drain()).outcomes == [("t:callback_or_poll", "slept")]
        assert await app.signal(woken, "answer", "woken") is True  # ends the second wait
        drained = await w.drain()
        assert drained.outcomes == [("t:callback_or_poll", "completed")]
        assert drained[0].result == "woken after 1 polls"
        task = await w.get(woken)
        assert [(s.name, s.kind, s.detail) for s in task.steps] == [
            ("wait-1", "wait", "timed out"),
            ("poll-1", "step", ""),
            ("wait-2", "wait", "received"),
        ]
        await app.enqueue("t:callback_or_poll", {"meanwhile": True}, task_id="kept")
        assert (await w.drain()).outcomes == [("t:callback_or_poll", "slept")]
        w.clock.advance("1h")
        assert (await w.drain()).outcomes == [("t:callback_or_poll", "completed")]
        assert (await w.get("kept")).result == "kept after 1 polls"
    assert polls == ["woken:1", "kept:1"]


async def test_a_wait_step_name_is_a_step_name(app: durq.App) -> None:
    @app.task("t:bad_wait")
    async def bad_wait(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        await ctx.wait_for("answer", timeout=1, step="")

    async with durq.testing.worker(app) as w:
        await app.enqueue("t:bad_wait", {}, max_retry=0)
        drained = await w.drain(raise_errors=False)
        assert isinstance(drained[0].error, durq.StepError)
