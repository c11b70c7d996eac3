"""Every broker against the scheduling model (``tests/scheduling_model.py``), step by step.

Hypothesis draws random sequences of enqueues, claims, completions, failures, hand-backs,
heartbeats, clock moves, rescues, inspector moves, pauses and janitor runs; each step runs
on the broker (through the same ``durq.lifecycle`` decisions a worker, rescuer and inspector
make) and on the model, and their answers must agree: which tasks a claim returns and in
which order, whether a fenced write held, refusals, and every task's state, retries and
losses. A failure prints the shrunk sequence of steps.

``make test`` runs a bounded number of sequences per broker; ``make model`` runs thousands
(``DURQ_MODEL_EXAMPLES``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

import scheduling_model as m
from durq import lifecycle
from durq.brokers import FullBroker, open_broker
from durq.brokers.base import ClaimParams, EnqueueParams, Lease, RetryParams
from durq.clock import FakeClock
from durq.errors import (
    DuplicateTaskError,
    InvalidStateError,
    QueueNotFoundError,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.states import TaskState
from durq.task import LimitSpec

EXAMPLES = int(os.environ.get("DURQ_MODEL_EXAMPLES", "25"))
STEPS = int(os.environ.get("DURQ_MODEL_STEPS", "40"))
LEASE = 30.0
MAX_LOST = 3
IDS = [f"t{i}" for i in range(6)]
#: The limits a task may carry: a concurrency key, a rate key (2 starts per 10 s), or both.
LIMITS: dict[str | None, tuple[LimitSpec, ...]] = {
    None: (),
    "k1": (LimitSpec("k", concurrency=1),),
    "k2": (LimitSpec("k", concurrency=2),),
    "r": (LimitSpec("r", rate=2, per=10.0),),
    "k1r": (LimitSpec("k", concurrency=1), LimitSpec("r", rate=2, per=10.0)),
}
_run = itertools.count()


class BrokerAgainstModel(RuleBasedStateMachine):
    """One random sequence: a broker (shared by the sequences of a test, each in queues of
    its own) and a fresh model."""

    broker: FullBroker
    clock: FakeClock
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        super().__init__()
        run = next(_run)
        self.queues = [f"m{run}a", f"m{run}b"]
        self.model = m.Model(now=self.clock.now(), max_lost=MAX_LOST)
        #: The leases a worker holds (broker lease and the model's token), and old ones.
        self.held: dict[tuple[str, str], tuple[Lease, str]] = {}
        self.stale: list[tuple[Lease, str]] = []
        self.seen: set[tuple[str, str]] = set()

    def call(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    # -- enqueue -------------------------------------------------------------------------------

    @rule(
        q=st.integers(0, 1),
        task_id=st.sampled_from(IDS),
        priority=st.sampled_from([-1, 0, 0, 1]),
        delay=st.sampled_from([0, 0, 5, 30]),
        max_retry=st.integers(0, 2),
        retention=st.sampled_from([0, 60]),
        limit=st.sampled_from([None, None, "k1", "k2", "r", "k1r"]),
        unique=st.booleans(),
    )
    def enqueue(
        self,
        q: int,
        task_id: str,
        priority: int,
        delay: int,
        max_retry: int,
        retention: int,
        limit: str | None,
        unique: bool,
    ) -> None:
        queue = self.queues[q]
        params = EnqueueParams(
            id=task_id,
            queue=queue,
            type="model:task",
            payload=json.dumps({"id": task_id}).encode(),
            max_retry=max_retry,
            retention=float(retention),
            priority=priority,
            process_in=float(delay) or None,
            unique_key=f"u:{queue}" if unique else None,
            unique_ttl=20.0 if unique else None,
            limits=LIMITS[limit],
        )
        try:
            self.call(self.broker.enqueue(params))
            got = "created"
        except TaskIDConflictError:
            got = "conflict"
        except DuplicateTaskError:
            got = "duplicate"
        try:
            self.model.enqueue(
                queue,
                task_id,
                priority=priority,
                delay=delay,
                max_retry=max_retry,
                retention=retention,
                limits={
                    spec.key: (spec.concurrency, spec.rate, spec.per) for spec in LIMITS[limit]
                },
                unique=f"u:{queue}" if unique else None,
                unique_ttl=20.0 if unique else None,
            )
            want = "created"
        except m.Refused as exc:
            want = exc.reason
        self.seen.add((queue, task_id))
        assert got == want

    # -- claim and the end of an attempt -------------------------------------------------------

    @rule(order=st.permutations([0, 1]), limit=st.integers(1, 3))
    def claim(self, order: list[int], limit: int) -> None:
        queues = [self.queues[i] for i in order]
        self.call(self.broker.promote_due())
        leases = self.call(
            self.broker.claim(
                ClaimParams(queues=queues, limit=limit, worker_id="w", lease_seconds=LEASE)
            )
        )
        taken = self.model.claim(queues, limit, LEASE)
        assert [(x.task.queue, x.task.id) for x in leases] == [t.key for t in taken]
        for lease, task in zip(leases, taken, strict=True):
            assert lease.task.state is TaskState.ACTIVE
            self.held[task.key] = (lease, task.token or "")

    def _take(self, index: int, stale: bool) -> tuple[Lease, str] | None:
        if stale:
            return self.stale[index % len(self.stale)] if self.stale else None
        if not self.held:
            return None
        key = sorted(self.held)[index % len(self.held)]
        lease_and_token = self.held.pop(key)
        self.stale.append(lease_and_token)
        return lease_and_token

    @rule(index=st.integers(0, 5), stale=st.booleans())
    def complete(self, index: int, stale: bool) -> None:
        taken = self._take(index, stale)
        if taken is None:
            return
        lease, token = taken
        params = lifecycle.completed(lease, b'{"ok": true}', now=self.clock.now())
        got = self.call(self.broker.complete(params))
        assert got == self.model.complete((lease.task.queue, lease.task.id), token)

    @rule(index=st.integers(0, 5), stale=st.booleans(), delay=st.sampled_from([0, 10]))
    def fail(self, index: int, stale: bool, delay: int) -> None:
        taken = self._take(index, stale)
        if taken is None:
            return
        lease, token = taken
        move = lifecycle.failed(lease, "boom", now=self.clock.now(), delay=lambda: float(delay))
        if isinstance(move, RetryParams):
            got = self.call(self.broker.retry(move))
        else:
            got = self.call(self.broker.archive(move))
        key = (lease.task.queue, lease.task.id)
        if lease.task.retried >= lease.task.max_retry:
            # The decision was made on the attempt's copy: it archives (the model agrees
            # whenever the fence holds, since a held lease's task has not moved since).
            assert not isinstance(move, RetryParams)
        assert got == self.model.fail(key, token, float(delay), "boom")

    @rule(index=st.integers(0, 5), stale=st.booleans())
    def hand_back(self, index: int, stale: bool) -> None:
        taken = self._take(index, stale)
        if taken is None:
            return
        lease, token = taken
        got = self.call(self.broker.requeue(lease.ref))
        assert got == self.model.requeue((lease.task.queue, lease.task.id), token)

    @rule()
    def heartbeat(self) -> None:
        held = list(self.held.values())
        if not held:
            return
        report = self.call(self.broker.extend_leases([lease.ref for lease, _ in held], LEASE))
        lost, cancel = self.model.extend(
            [((lease.task.queue, lease.task.id), token) for lease, token in held], LEASE
        )
        assert (set(report.lost), set(report.cancel)) == (lost, cancel)

    # -- time, the rescuer and the janitor -----------------------------------------------------

    @rule(seconds=st.sampled_from([1, 5, 11, 31]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.model.advance(seconds)

    @rule()
    def rescue(self) -> None:
        rescued = self.call(lifecycle.rescue_expired(self.broker, MAX_LOST))
        mine = {(t.queue, t.id) for t in rescued if t.queue in self.queues}
        assert mine == set(self.model.rescue())

    @rule()
    def janitor(self) -> None:
        self.call(self.broker.delete_expired(10_000))
        self.model.janitor()

    # -- the inspector -------------------------------------------------------------------------

    @rule(
        action=st.sampled_from(["run", "archive", "delete", "cancel"]),
        q=st.integers(0, 1),
        task_id=st.sampled_from(IDS),
    )
    def inspect(self, action: str, q: int, task_id: str) -> None:
        queue = self.queues[q]
        steer = {
            "run": lifecycle.run_task,
            "archive": lifecycle.archive_task,
            "delete": lifecycle.delete_task,
            "cancel": lifecycle.cancel_task,
        }[action]
        try:
            self.call(steer(self.broker.admin, queue, task_id))
            got = "ok"
        except TaskNotFoundError:
            got = "not found"
        except InvalidStateError:
            got = "invalid state"
        try:
            getattr(self.model, action)((queue, task_id))
            want = "ok"
        except m.Refused as exc:
            want = exc.reason
        assert got == want

    @rule(q=st.integers(0, 1), paused=st.booleans())
    def pause(self, q: int, paused: bool) -> None:
        queue = self.queues[q]
        try:
            if paused:
                self.call(self.broker.admin.pause_queue(queue))
            else:
                self.call(self.broker.admin.unpause_queue(queue))
            got = "ok"
        except QueueNotFoundError:
            got = "no queue"
        try:
            self.model.pause(queue, paused)
            want = "ok"
        except m.Refused as exc:
            want = exc.reason
        assert got == want

    # -- what every task looks like after each step --------------------------------------------

    @invariant()
    def every_task_as_the_model_says(self) -> None:
        now = self.clock.now()
        for key in sorted(self.seen):
            try:
                info = self.call(self.broker.admin.get_task(*key))
            except TaskNotFoundError:
                got = None
            else:
                state = info.state.value
                due = info.next_process_at is None or info.next_process_at.timestamp() <= now
                if state in m.WAITING and due:
                    state = "due"
                got = (state, info.retried, info.lost)
            assert got == self.model.observe(key), key


@pytest.fixture
def machine(broker_url: str) -> Iterator[type[BrokerAgainstModel]]:
    """The state machine class bound to one migrated broker on its own event loop."""
    loop = asyncio.new_event_loop()
    clock = FakeClock(1_800_000_000.0)
    broker = open_broker(broker_url, clock=clock)
    loop.run_until_complete(broker.migrate())
    loop.run_until_complete(broker.connect())
    bound = type(
        "BrokerAgainstModel",
        (BrokerAgainstModel,),
        {"broker": broker, "clock": clock, "loop": loop},
    )
    try:
        yield bound
    finally:
        loop.run_until_complete(broker.close())
        loop.close()


def test_every_broker_answers_as_the_model(machine: type[BrokerAgainstModel]) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
