"""Signals (``ctx.wait_for`` and ``app.signal``) on every broker: a signal is stored on its
task exactly once, kept for a task that does not wait yet, and makes a task waiting for it
claimable in the same atomic step; a wait for a signal already kept does not wait."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from brokerkit import LEASE, A, C, P, S, W, X, claim, claim_ids, params

import durq
from conformance.apps import FAST, wait_for_state
from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import ClaimParams, CompleteParams, RetryParams, SignalParams, TaskMove
from durq.clock import FakeClock
from durq.errors import TaskNotFoundError
from durq.states import TaskState


def sig(name: str, payload: object = None, task_id: str = "t") -> SignalParams:
    return SignalParams("default", task_id, name, json.dumps(payload))


async def state_of(broker: FullBroker, task_id: str = "t") -> object:
    return (await broker.admin.get_task("default", task_id)).state


async def test_W19_a_signal_is_kept_for_a_task_that_does_not_wait_yet(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    assert await broker.signal(sig("partner-callback", {"policy": "POL-1", "n": 1.5})) == "kept"
    assert await state_of(broker) is P
    (lease,) = await claim(broker)
    stored = await broker.read_signals(lease.ref)
    assert stored is not None
    assert json.loads(stored) == {"partner-callback": {"policy": "POL-1", "n": 1.5}}
    # Once: a second signal of the same name changes nothing.
    assert await broker.signal(sig("partner-callback", "again")) == "duplicate"
    assert await broker.signal(sig("other", [1, 2])) == "kept"
    stored = await broker.read_signals(lease.ref)
    assert stored is not None
    assert json.loads(stored) == {
        "partner-callback": {"policy": "POL-1", "n": 1.5},
        "other": [1, 2],
    }


async def test_W19_a_task_without_signals_reads_none(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.read_signals(lease.ref) is None


async def test_W19_a_signal_wakes_the_task_waiting_for_it(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t", max_retry=0))
    (lease,) = await claim(broker)
    wait = RetryParams(lease.ref, "", 3600.0, snooze=True, awaits="partner-callback")
    assert await broker.retry(wait)
    assert await state_of(broker) is W
    # Another name is kept; the task waits on.
    assert await broker.signal(sig("unrelated", 1)) == "kept"
    assert await state_of(broker) is W
    assert await claim_ids(broker) == []
    assert await broker.signal(sig("partner-callback", {"ok": True})) == "woken"
    info = await broker.admin.get_task("default", "t")
    assert info.state is P
    assert info.next_process_at is not None
    assert info.next_process_at.timestamp() <= clock.now() + 1
    (again,) = await claim(broker)
    stored = await broker.read_signals(again.ref)
    assert stored is not None
    assert json.loads(stored) == {"unrelated": 1, "partner-callback": {"ok": True}}
    # No attempt was spent on the wait.
    assert (await broker.admin.get_task("default", "t")).retried == 0


async def test_W19_a_wait_whose_time_ran_out_is_pending_after_the_promoter(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t", max_retry=0))
    (lease,) = await claim(broker)
    assert await broker.retry(RetryParams(lease.ref, "", 60.0, snooze=True, awaits="cb"))
    await broker.promote_due()
    assert await state_of(broker) is W
    clock.advance(61)
    # Not claimable by its time alone: the promoter ends the wait (the handler then raises
    # its timeout), so a claim never mistakes a waiting task for a due one.
    assert await broker.claim(ClaimParams(["default"], 10, "w1", LEASE)) == []
    assert await state_of(broker) is W
    assert await broker.promote_due() == 1
    assert await state_of(broker) is P
    assert await claim_ids(broker) == ["t"]


async def test_W19_an_inspector_move_ends_a_wait_for_good(
    broker: FullBroker, clock: FakeClock
) -> None:
    for task_id in ("a", "b"):
        await broker.enqueue(params(task_id, max_retry=0))
    for lease in await claim(broker, limit=2):
        assert await broker.retry(RetryParams(lease.ref, "", 60.0, snooze=True, awaits="cb"))
    assert await broker.admin.move_task(TaskMove("default", "a", expect=W, to=X)) is not None
    assert await broker.admin.move_task(TaskMove("default", "b", expect=W, to=None)) is not None
    clock.advance(61)
    assert await broker.promote_due() == 0
    assert await state_of(broker, "a") is X
    assert await broker.signal(sig("cb", task_id="a")) == "finished"


async def test_W19_a_wait_for_a_signal_already_kept_does_not_wait(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    # Delivered while the attempt runs: kept (the task is not waiting yet)...
    assert await broker.signal(sig("cb", "early")) == "kept"
    assert await state_of(broker) is A
    # ... so the wait the attempt then asks for ends at once: pending, not waiting.
    assert await broker.retry(RetryParams(lease.ref, "", 3600.0, snooze=True, awaits="cb"))
    assert await state_of(broker) is P
    assert await claim_ids(broker) == ["t"]


async def test_W19_a_later_move_forgets_what_the_task_waited_for(broker: FullBroker) -> None:
    await broker.enqueue(params("t", max_retry=5))
    (lease,) = await claim(broker)
    assert await broker.retry(RetryParams(lease.ref, "", 0.0, snooze=True, awaits="cb"))
    (lease,) = await claim(broker)
    # Now it sleeps for something else: the signal is kept, and wakes nothing.
    assert await broker.retry(RetryParams(lease.ref, "", 3600.0, snooze=True))
    assert await broker.signal(sig("cb")) == "kept"
    assert await state_of(broker) is S


async def test_W19_signals_to_missing_or_finished_tasks(broker: FullBroker) -> None:
    with pytest.raises(TaskNotFoundError):
        await broker.signal(sig("cb", task_id="nope"))
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.signal(sig("before", 1)) == "kept"
    assert await broker.complete(CompleteParams(lease.ref, retention=60))
    assert await state_of(broker) is C
    assert await broker.signal(sig("cb")) == "finished"
    # A sender that calls again after the end hears "duplicate", as before it.
    assert await broker.signal(sig("before", 2)) == "duplicate"


async def test_W19_reading_signals_is_fenced_by_the_lease(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t", max_retry=5))
    (first,) = await claim(broker)
    assert await broker.signal(sig("cb", 1)) == "kept"
    clock.advance(LEASE + 1)
    await lifecycle.rescue_expired(broker, 3)
    assert await broker.read_signals(first.ref) is None
    (second,) = await claim(broker)
    stored = await broker.read_signals(second.ref)
    assert stored is not None and json.loads(stored) == {"cb": 1}


# -- ctx.wait_for and app.signal, through a worker ------------------------------------------


async def test_W19_a_waiting_task_resumes_with_the_signal(app: durq.App) -> None:
    checks: list[int] = []

    @app.task("signals:order", retention=60, max_retry=0)
    async def order(payload: dict[str, Any], ctx: durq.TaskContext) -> Any:
        await ctx.step("check", lambda: checks.append(1))
        answer = await ctx.wait_for("partner-callback", timeout="1h")
        return {"policy": answer["policy"]}

    info = await app.enqueue("signals:order", {})
    async with app.worker(**FAST):
        waiting = await wait_for_state(app, "default", info.id, TaskState.WAITING)
        assert waiting.next_process_at is not None
        assert waiting.next_process_at.timestamp() > time.time() + 3000
        assert await app.signal(info, "partner-callback", {"policy": "POL-7"}) is True
        assert await app.signal(info, "partner-callback", {"policy": "other"}) is False
        assert await app.wait(info, timeout=20) == {"policy": "POL-7"}
    done = await app.inspector.get_task_info("default", info.id)
    assert (checks, done.retried, done.snoozes) == ([1], 0, 1)
    wait = done.steps[-1]
    assert wait.name == "partner-callback" and "received" in wait.describe()
    with pytest.raises(durq.InvalidStateError):
        await app.signal(info, "late", 1)


async def test_W19_a_signal_sent_first_is_there_when_the_task_waits(app: durq.App) -> None:
    @app.task("signals:early", retention=60, max_retry=0)
    async def early(payload: dict[str, Any], ctx: durq.TaskContext) -> Any:
        return await ctx.wait_for("go", timeout=60)

    info = await app.enqueue("signals:early", {}, process_in=3600)
    assert await app.signal(info.id, "go", [1, "two"]) is True
    await app.inspector.run_task("default", info.id)
    async with app.worker(**FAST):
        assert await app.wait(info, timeout=20) == [1, "two"]
    # It never left the worker to wait.
    assert (await app.inspector.get_task_info("default", info.id)).snoozes == 0


async def test_W19_a_wait_times_out_with_a_typed_error(app: durq.App) -> None:
    @app.task("signals:timeout", retention=60, max_retry=0)
    def timeout(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        try:
            ctx.wait_for_sync("never", timeout=0.2)
        except durq.SignalTimeoutError:
            return "gave up waiting"
        return "got it"

    info = await app.enqueue("signals:timeout", {})
    async with app.worker(**FAST):
        assert await app.wait(info, timeout=20) == "gave up waiting"
    done = await app.inspector.get_task_info("default", info.id)
    assert "timed out" in done.steps[-1].describe()
    # A signal after the timeout changes nothing for the recorded wait.
    with pytest.raises(durq.InvalidStateError):
        await app.signal(info, "never", 1)


async def test_W19_signal_input_is_checked(app: durq.App) -> None:
    info = await app.enqueue("signals:none", {}, process_in=3600)
    with pytest.raises(durq.StepError, match="signal name"):
        await app.signal(info, "no spaces", 1)
    with pytest.raises(durq.PayloadError, match="NUL"):
        await app.signal(info, "cb", "a\x00b")
    with pytest.raises(durq.PayloadError):
        await app.signal(info, "cb", object())
    with pytest.raises(durq.TaskNotFoundError):
        await app.signal("missing", "cb", 1)
    # A backslash before "u0000" is not a NUL.
    assert await app.signal(info, "cb", "\\u0000") is True


@pytest.mark.parametrize("broker_kind", ["memory"], indirect=True)
async def test_W19_a_wait_outside_a_worker_times_out_at_once(broker_kind: str) -> None:
    ctx = durq.TaskContext("t", "default", "x", 0, 0, None, {}, "w")
    with pytest.raises(durq.SignalTimeoutError):
        await ctx.wait_for("cb", timeout=60)
