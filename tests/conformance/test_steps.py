"""Durable steps (``ctx.step``) on every broker: a recorded step does not run again when
its task runs again (a retry, a rescued lease), its write is fenced by the lease, and the
task shows its steps."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from typing import Any, cast

import pytest
from brokerkit import LEASE, A, R, S, claim, claim_ids, params

import durq
from conformance.apps import FAST, wait_for_state, wait_until
from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import (
    CAP_COMPLETE_AND_CLAIM,
    ClaimParams,
    CompleteAndClaim,
    CompleteParams,
    Lease,
    RetryParams,
    StepsParams,
)
from durq.clock import FakeClock
from durq.states import TaskState
from durq.steps import decode, encode, entries
from durq.task import LimitSpec
from durq.worker.steps import AttemptSteps, step_writer


def stored(**results: Any) -> str:
    return encode(
        {
            name: {"result": value, "started": 10.0, "ended": 10.5, "attempt": 1}
            for name, value in results.items()
        }
    )


async def test_W16_steps_are_stored_on_the_task_and_shown(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.read_steps(lease.ref) is None
    assert await broker.record_steps(StepsParams(lease.ref, stored(charge={"id": "ch_1"})))
    assert await broker.record_steps(
        StepsParams(lease.ref, stored(charge={"id": "ch_1"}, mail=None))
    )
    assert await broker.read_steps(lease.ref) == stored(charge={"id": "ch_1"}, mail=None)
    info = await broker.admin.get_task("default", "t")
    assert info.state is A
    assert [(s.name, s.result, s.duration, s.attempt) for s in info.steps] == [
        ("charge", {"id": "ch_1"}, 0.5, 1),
        ("mail", None, 0.5, 1),
    ]
    assert [s["name"] for s in info.to_dict()["steps"]] == ["charge", "mail"]
    assert await broker.complete(CompleteParams(lease.ref, retention=60))
    assert len((await broker.admin.get_task("default", "t")).steps) == 2


async def test_W16_a_stale_lease_cannot_record_a_step(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=5))
    (first,) = await claim(broker, worker="zombie")
    assert await broker.record_steps(StepsParams(first.ref, stored(a=1)))
    clock.advance(LEASE + 1)
    (rescued,) = await lifecycle.rescue_expired(broker, 3)
    assert rescued.state is R
    # Not active any more: refused.
    assert not await broker.record_steps(StepsParams(first.ref, stored(a=1, zombie=2)))
    (second,) = await claim(broker, worker="healthy")
    # The step recorded before the lease expired survives the rescue.
    assert await broker.read_steps(second.ref) == stored(a=1)
    # Active again under another lease: still refused, and nothing changed.
    assert not await broker.record_steps(StepsParams(first.ref, stored(a=1, zombie=2)))
    assert await broker.read_steps(second.ref) == stored(a=1)
    assert await broker.record_steps(StepsParams(second.ref, stored(a=1, b=2)))
    assert await broker.complete(CompleteParams(second.ref, retention=60))
    assert [s.name for s in (await broker.admin.get_task("default", "t")).steps] == ["a", "b"]


async def test_W16_steps_of_several_attempts_in_one_call_are_each_fenced(
    broker: FullBroker, clock: FakeClock
) -> None:
    """record_steps_many: one answer per item, in order, each fenced by its own lease."""
    assert await broker.record_steps_many([]) == []
    for task_id in ("a", "b", "stale"):
        await broker.enqueue(params(task_id, max_retry=5))
    leases = {lease.task.id: lease for lease in await claim(broker)}
    # "stale" loses its lease: rescued, then claimed again under a new token.
    assert await broker.retry(RetryParams(leases["stale"].ref, "boom", 0.0))
    (again,) = await claim(broker)
    a, b, stale = leases["a"].ref, leases["b"].ref, leases["stale"].ref
    answers = await broker.record_steps_many(
        [
            StepsParams(a, stored(x=1)),
            StepsParams(stale, stored(zombie=1)),
            StepsParams(b, stored(y=2)),
            StepsParams(a, stored(x=1, z=3)),  # the same lease again: written after the first
        ]
    )
    assert answers == [True, False, True, True]
    assert await broker.read_steps(a) == stored(x=1, z=3)
    assert await broker.read_steps(b) == stored(y=2)
    assert await broker.read_steps(again.ref) is None
    assert await broker.record_steps_many([StepsParams(again.ref, stored(w=4))]) == [True]
    assert await broker.read_steps(again.ref) == stored(w=4)


async def test_W16_a_claim_returns_the_recorded_steps(broker: FullBroker) -> None:
    """An attempt starts from the steps its claim returned, without reading them: every way
    of claiming returns them (a plain claim, a task with limits, a claim with completions)."""
    await broker.enqueue(params("t", max_retry=5))
    await broker.enqueue(params("lim", max_retry=5, limits=(LimitSpec("k", concurrency=5),)))
    leases = await claim(broker)
    assert sorted(lease.task.id for lease in leases) == ["lim", "t"]
    assert all(lease.task.steps == () for lease in leases)
    for lease in leases:
        assert await broker.record_steps(StepsParams(lease.ref, stored(a={"x": [1]}, b=None)))
        assert await broker.retry(RetryParams(lease.ref, "boom", 0.0))
    again = await claim(broker)
    assert sorted(lease.task.id for lease in again) == ["lim", "t"]
    for lease in again:
        assert entries(lease.task.steps) == decode(await broker.read_steps(lease.ref))
        assert entries(lease.task.steps) == decode(stored(a={"x": [1]}, b=None))
    if CAP_COMPLETE_AND_CLAIM not in broker.capabilities:
        return
    (plain,) = [lease for lease in again if lease.task.id == "t"]
    assert await broker.retry(RetryParams(plain.ref, "boom", 0.0))
    await broker.promote_due()
    (limited,) = [lease for lease in again if lease.task.id == "lim"]
    held, (third,) = await cast(CompleteAndClaim, broker).complete_and_claim(
        [CompleteParams(limited.ref)], ClaimParams(["default"], 10, "w1", LEASE)
    )
    assert held == [True]
    assert third.task.id == "t"
    assert entries(third.task.steps) == decode(stored(a={"x": [1]}, b=None))


async def test_W16_a_recorded_step_does_not_run_again_on_retry(app: durq.App) -> None:
    calls: list[str] = []

    def charge(order: str) -> dict[str, str]:
        calls.append(order)
        return {"charge": f"ch_{order}"}

    @app.task("steps:async", retention=60, retry_delay=lambda n, e: 0.0)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> Any:
        charged = await ctx.step("charge", charge, payload["order"])
        if ctx.attempt == 1:
            raise RuntimeError("mail server down")
        return charged

    info = await app.enqueue("steps:async", {"order": "o1"})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert calls == ["o1"]
    assert done.retried == 1
    assert done.result == {"charge": "ch_o1"}
    assert [(s.name, s.attempt) for s in done.steps] == [("charge", 1)]


async def test_W16_a_sync_handler_steps_from_its_thread(app: durq.App) -> None:
    calls: list[int] = []

    def add(a: int, b: int) -> int:
        assert threading.current_thread() is not threading.main_thread()
        calls.append(a + b)
        return a + b

    @app.task("steps:sync", retention=60, retry_delay=lambda n, e: 0.0)
    def job(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        total = int(ctx.step_sync("add", add, 1, 2))
        if ctx.attempt < 3:
            raise RuntimeError("again")
        return total + int(ctx.step_sync("more", add, total, 4))

    info = await app.enqueue("steps:sync", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert calls == [3, 7]
    assert done.result == 10
    assert [(s.name, s.attempt) for s in done.steps] == [("add", 1), ("more", 3)]


async def test_W16_a_step_name_twice_in_one_attempt_fails_it(app: durq.App) -> None:
    @app.task("steps:twice", retention=60, max_retry=0)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("a", lambda: 2)

    info = await app.enqueue("steps:twice", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert "called twice" in (done.last_error or "")


async def test_W16_a_step_result_must_be_json(app: durq.App) -> None:
    @app.task("steps:json", retention=60, max_retry=0)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        await ctx.step("a", lambda: object())

    info = await app.enqueue("steps:json", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert "must be JSON" in (done.last_error or "")
    assert done.steps == ()


@pytest.mark.parametrize("broker_kind", ["memory"], indirect=True)
async def test_W16_steps_outside_a_worker_run_every_time(broker_kind: str) -> None:
    ctx = durq.TaskContext("t", "default", "x", 0, 0, None, {}, "w")
    assert await ctx.step("a", lambda: (1, 2)) == [1, 2]
    assert ctx.step_sync("b", lambda: {"k": 1}) == {"k": 1}


# -- snooze ---------------------------------------------------------------------------------


async def test_W17_a_snooze_is_scheduled_without_counting_an_attempt(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t", max_retry=5))
    (first,) = await claim(broker)
    assert await broker.retry(RetryParams(first.ref, "boom", 0.0))
    (second,) = await claim(broker)
    assert await broker.read_snoozes(second.ref) == 0
    assert await broker.retry(RetryParams(second.ref, "", 30.0, snooze=True))
    info = await broker.admin.get_task("default", "t")
    assert info.state is S
    assert (info.retried, info.snoozes, info.last_error) == (1, 1, "boom")
    assert info.to_dict()["snoozes"] == 1
    # Refused once the lease is gone.
    assert await broker.read_snoozes(second.ref) is None
    assert not await broker.retry(RetryParams(second.ref, "", 30.0, snooze=True))
    assert await claim_ids(broker) == []
    clock.advance(31)
    await broker.promote_due()
    (third,) = await claim(broker)
    assert await broker.read_snoozes(third.ref) == 1


async def test_W17_snooze_does_not_count_attempts_and_is_bounded(app: durq.App) -> None:
    seen: list[int] = []

    @app.task("steps:snooze", retention=60, max_retry=0, max_snoozes=2)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        seen.append(ctx.attempt)
        await ctx.step("once", lambda: len(seen))
        ctx.snooze(0)

    info = await app.enqueue("steps:snooze", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    # Two snoozes allowed, the third archives; no attempt was counted (max_retry=0).
    assert seen == [1, 1, 1]
    assert (done.retried, done.snoozes, done.last_error) == (0, 2, "snoozed too often")
    assert [(s.name, s.result) for s in done.steps] == [("once", 1)]


async def test_W17_a_sync_handler_snoozes_then_completes(app: durq.App) -> None:
    runs: list[int] = []

    @app.task("steps:snooze_sync", retention=60, max_retry=0)
    def job(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        runs.append(ctx.attempt)
        if len(runs) < 3:
            raise durq.Snooze(0.05, "partner busy")
        return "ok"

    info = await app.enqueue("steps:snooze_sync", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert runs == [1, 1, 1]
    assert (done.retried, done.snoozes, done.result) == (0, 2, "ok")


async def test_W16_a_step_of_a_lost_lease_fails_instead_of_going_on(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t", max_retry=5))
    (lease,) = await claim(broker)
    steps = AttemptSteps(broker, lease.ref, 1, clock, asyncio.get_running_loop(), 1 << 20)
    ctx = durq.TaskContext("t", "default", "x", 0, 5, None, {}, "w", steps=steps)
    assert await ctx.step("a", lambda: 1) == 1
    clock.advance(LEASE + 1)
    await lifecycle.rescue_expired(broker, 3)
    with pytest.raises(durq.StepError, match="lost its lease"):
        await ctx.step("b", lambda: 2)
    with pytest.raises(durq.StepError, match="called twice"):
        await ctx.step("a", lambda: 1)


async def test_W16_steps_written_together_each_answer_their_own_attempt(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A worker's attempts share step writes (step_writer): recorded at the same time they go
    as one record_steps_many, and a step whose lease is lost still fails alone."""
    for task_id in ("a", "b", "c"):
        await broker.enqueue(params(task_id, max_retry=5))
    leases = {lease.task.id: lease for lease in await claim(broker)}
    assert await broker.retry(RetryParams(leases["b"].ref, "lost", 0.0))
    sent: list[int] = []
    many = broker.record_steps_many

    async def counted(items: Any) -> list[bool]:
        sent.append(len(items))
        return await many(items)

    broker.record_steps_many = counted  # type: ignore[method-assign]
    writer = step_writer(broker)
    loop = asyncio.get_running_loop()

    def context(task_id: str, lease: Lease) -> durq.TaskContext:
        # recorded=(): the three steps reach the writer in one pass, none reads first.
        sink = AttemptSteps(
            broker, lease.ref, 1, clock, loop, 1 << 20, recorded=(), write=writer.send
        )
        return durq.TaskContext(task_id, "default", "x", 0, 5, None, {}, "w", steps=sink)

    contexts = {task_id: context(task_id, lease) for task_id, lease in leases.items()}
    results = await asyncio.gather(
        *(ctx.step("s", lambda t=task_id: t) for task_id, ctx in contexts.items()),
        return_exceptions=True,
    )
    assert results[0] == "a" and results[2] == "c"
    assert isinstance(results[1], durq.StepError) and "lost its lease" in str(results[1])
    assert sent == [3]  # recorded in one pass of the loop: one round trip
    assert await broker.read_steps(leases["a"].ref) is not None
    assert await broker.read_steps(leases["c"].ref) is not None
    info = await broker.admin.get_task("default", "b")
    assert info.steps == ()


# -- durable sleep --------------------------------------------------------------------------


async def test_W18_a_sleep_resumes_after_its_recorded_steps(app: durq.App) -> None:
    checks: list[str] = []
    issued: list[str] = []

    @app.task("steps:sleep", retention=60, max_retry=0)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        quote = await ctx.step("check", lambda: checks.append("c") or "q-1")
        await ctx.sleep("cool-off", 0.3)
        return str(await ctx.step("issue", lambda: issued.append(quote) or f"policy-{quote}"))

    info = await app.enqueue("steps:sleep", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert (checks, issued, done.result) == (["c"], ["q-1"], "policy-q-1")
    # Neither an attempt nor a snooze the handler asked for: the counter says it left once.
    assert (done.retried, done.snoozes) == (0, 1)
    names = [(s.name, s.sleep_until is not None) for s in done.steps]
    assert names == [("check", False), ("cool-off", True), ("issue", False)]
    sleep = done.steps[1]
    assert sleep.sleep_until == pytest.approx(sleep.started + 0.3)
    assert "sleeps until" in sleep.describe()
    assert done.to_dict()["steps"][1]["sleep_until"] is not None


async def test_W18_a_sleeping_task_frees_its_slot_and_an_early_run_sleeps_the_rest(
    app: durq.App,
) -> None:
    runs: list[int] = []

    @app.task("steps:nap", retention=60, max_retry=0)
    async def nap(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        runs.append(1)
        await ctx.sleep_until("nap", time.time() + 3600 if len(runs) == 1 else 0)

    @app.task("steps:other", retention=60)
    async def other(payload: dict[str, Any]) -> str:
        return "ran"

    sleeper = await app.enqueue("steps:nap", {})
    async with app.worker(concurrency=1, **FAST):
        asleep = await wait_for_state(app, "default", sleeper.id, TaskState.SCHEDULED)
        # The one slot is free while the first task sleeps.
        second = await app.enqueue("steps:other", {})
        assert (await app.wait(second, timeout=20)) == "ran"
        assert asleep.next_process_at is not None
        assert asleep.next_process_at.timestamp() > time.time() + 3000
        # Run before its time: the recorded end stands (the handler asks for another
        # moment on its second run, which is not used), and it sleeps the rest.
        await app.inspector.run_task("default", sleeper.id)

        async def slept_twice() -> bool:
            task = await app.inspector.get_task_info("default", sleeper.id)
            return task.snoozes == 2 and task.state is TaskState.SCHEDULED

        await wait_until(slept_twice, timeout=20)
    task = await app.inspector.get_task_info("default", sleeper.id)
    assert runs == [1, 1]
    assert task.retried == 0
    # The same end (the delay is measured again against the broker's clock: within a second).
    assert task.next_process_at is not None
    assert abs((task.next_process_at - asleep.next_process_at).total_seconds()) < 1


async def test_W18_sleeps_do_not_use_up_max_snoozes(app: durq.App) -> None:
    runs: list[int] = []

    @app.task("steps:sleep_snooze", retention=60, max_retry=0, max_snoozes=1)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        runs.append(1)
        await ctx.sleep("a", 0.05)
        await ctx.sleep("b", 0.05)
        ctx.snooze(0)

    info = await app.enqueue("steps:sleep_snooze", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    # Two sleeps, one snooze allowed, the second snooze archives.
    assert len(runs) == 4
    assert (done.retried, done.snoozes, done.last_error) == (0, 3, "snoozed too often")


async def test_W18_except_exception_does_not_swallow_a_sleep(app: durq.App) -> None:
    @app.task("steps:swallow", retention=60, max_retry=0)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        try:
            await ctx.sleep("nap", 0.1)
        except Exception:
            return "swallowed"
        return "slept"

    info = await app.enqueue("steps:swallow", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert (done.result, done.snoozes) == ("slept", 1)


async def test_W18_a_sync_handler_sleeps_from_its_thread(app: durq.App) -> None:
    runs: list[int] = []

    @app.task("steps:sleep_sync", retention=60, max_retry=0)
    def job(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        runs.append(1)
        ctx.sleep_sync("nap", "100ms")
        ctx.sleep_until_sync("past", 0)  # already past: returns at once, recorded as over
        return len(runs)

    info = await app.enqueue("steps:sleep_sync", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert (done.result, done.snoozes) == (2, 1)
    assert [s.name for s in done.steps] == ["nap", "past"]


async def test_W18_a_step_renamed_to_a_sleep_fails_clearly(app: durq.App) -> None:
    runs: list[int] = []

    @app.task("steps:renamed", retention=60, max_retry=0, max_snoozes=5)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        runs.append(1)
        if len(runs) == 1:
            await ctx.step("x", lambda: 1)
            ctx.snooze(0)
        await ctx.sleep("x", 1)  # the next deploy made "x" a sleep

    info = await app.enqueue("steps:renamed", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert "recorded as a step" in (done.last_error or "")


@pytest.mark.parametrize("broker_kind", ["memory"], indirect=True)
async def test_W18_a_sleep_outside_a_worker_returns_at_once(broker_kind: str) -> None:
    ctx = durq.TaskContext("t", "default", "x", 0, 0, None, {}, "w")
    await ctx.sleep("a", 3600)
    ctx.sleep_sync("b", "1h")
    with pytest.raises(ValueError, match=">= 0"):
        await ctx.sleep("c", -1)
    with pytest.raises(ValueError, match="aware"):
        await ctx.sleep_until("d", datetime(2030, 1, 1))
