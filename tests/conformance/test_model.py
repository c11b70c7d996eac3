"""Every broker against the scheduling model (``tests/scheduling_model.py``), step by step.

Hypothesis draws random sequences of enqueues (single tasks with limits, uniqueness and
continuations, groups with a fan-in follow-up, and workflows created all or none), claims (queues in strict or weighted
order), completions, failures, hand-backs, heartbeats, clock moves, rescues, inspector moves,
pauses, an operator's overrides of a key's limit and janitor runs; each step runs on the
broker (through the same ``durq.lifecycle`` decisions a worker, rescuer and inspector make)
and on the model, and their answers must agree: which tasks a claim returns and in which order, whether a fenced write held, refusals,
every task's state, retries, losses and the key it is held on, each limit key's running
attempts, tokens and held tasks, each group's progress, and the follow-ups an outcome
created. A failure prints the shrunk sequence of steps.

``make test`` runs a bounded number of sequences per broker; ``make model`` runs thousands
(``DURQ_MODEL_EXAMPLES``)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import scheduling_model as m
from durq import continuations, groups, lifecycle
from durq.brokers import FullBroker, open_broker
from durq.brokers.base import (
    CAP_CROSS_QUEUE_GROUPS,
    ArchivedRetention,
    ClaimParams,
    EnqueueParams,
    Lease,
    LimitOverride,
    RetryParams,
    SignalParams,
    TwinReplace,
    UniqueRelease,
)
from durq.clock import FakeClock
from durq.errors import (
    DuplicateTaskError,
    GroupNotFoundError,
    InvalidStateError,
    QueueNotFoundError,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.states import TaskState
from durq.task import LimitSpec
from durq.worker.fetcher import queue_order

# 12 sequences keep `make test` about as long as 25 took before the model read keys and groups.
EXAMPLES = int(os.environ.get("DURQ_MODEL_EXAMPLES", "12"))
STEPS = int(os.environ.get("DURQ_MODEL_STEPS", "40"))
SHRINK = os.environ.get("DURQ_MODEL_SHRINK", "1") != "0"
LEASE = 30.0
MAX_LOST = 3
IDS = [f"t{i}" for i in range(6)]
#: The limits a task may carry: a concurrency key with two limits, so that tasks of one key
#: carry different ones (a change of limit), a rate key (1 or 2 starts per 10 s: tasks of one
#: key may carry different rates too), or both.
LIMITS: dict[str | None, tuple[LimitSpec, ...]] = {
    None: (),
    "k1": (LimitSpec("k", concurrency=1),),
    "k2": (LimitSpec("k", concurrency=2),),
    "r1": (LimitSpec("r", rate=1, per=10.0),),
    "r2": (LimitSpec("r", rate=2, per=10.0),),
    "k1r1": (LimitSpec("k", concurrency=1), LimitSpec("r", rate=1, per=10.0)),
    # The rate first: a claim looks at "r" before "k" holds the task back.
    "r1k1": (LimitSpec("r", rate=1, per=10.0), LimitSpec("k", concurrency=1)),
    # W22: three partitions of one fair template (one shares the concurrency key "k"), two
    # slots each, one of them with a rate too: partitions take turns, and a full one is held.
    "fa": (LimitSpec("f:a", concurrency=2, fair="f:{p}"),),
    "fb": (LimitSpec("f:b", concurrency=2, fair="f:{p}"),),
    "fck": (LimitSpec("f:c", concurrency=2, fair="f:{p}"), LimitSpec("k", concurrency=2)),
    "far": (LimitSpec("f:a", concurrency=2, fair="f:{p}"), LimitSpec("r", rate=2, per=10.0)),
    # W24: tasks that take both slots of "k" or both tokens of "r" beside those taking one.
    "k2c2": (LimitSpec("k", concurrency=2, cost=2),),
    "r2c2": (LimitSpec("r", rate=2, per=10.0, cost=2),),
    # W25: a sequence, alone, with a rate (a limit of its own, after it and before it, so
    # that a task holding "s" waits for a token on "r"), beside a concurrency key (after it,
    # and before it so that a task holding "s" may be held on "k").
    "s": (LimitSpec("s", concurrency=1, sequence=True),),
    "sr": (LimitSpec("s", concurrency=1, sequence=True), LimitSpec("r", rate=1, per=10.0)),
    "rs": (LimitSpec("r", rate=2, per=10.0), LimitSpec("s", concurrency=1, sequence=True)),
    "sk": (LimitSpec("s", concurrency=1, sequence=True), LimitSpec("k", concurrency=2)),
    "ks": (LimitSpec("k", concurrency=1), LimitSpec("s", concurrency=1, sequence=True)),
}
#: The limits a random task draws, from LIMITS (no limit more often).
DRAWN_LIMITS = [None, None, "k1", "k2", "r1", "r2", "k1r1", "r1k1", "fa", "fa", "fb", "fck", "far"]
DRAWN_LIMITS += ["k2c2", "r2c2", "s", "s", "sr", "rs", "sk", "ks"]
#: A continuation: none, on completion only, or on completion and archiving.
THEN = [None, None, "completed", "finished"]
_run = itertools.count()
#: What ``groups.build`` and ``continuations.resolve`` read of an app: no registered types.
_NO_APP = SimpleNamespace(tasks={})

task_options = st.fixed_dictionaries(
    {
        "priority": st.sampled_from([-1, 0, 0, 1]),
        "delay": st.sampled_from([0, 0, 5, 30]),
        "max_retry": st.integers(0, 2),
        "retention": st.sampled_from([0, 60]),
        "limit": st.sampled_from(DRAWN_LIMITS),
        "unique": st.sampled_from([False, False, False, True]),
    }
)


#: The tasks a workflow's task waits for, by index (only earlier ones count).
_AFTER = st.lists(st.integers(0, 2), max_size=2, unique=True)


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
        self.groups = 0

    def call(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    # -- enqueue -------------------------------------------------------------------------------

    def _params(
        self, queue: str, task_id: str, o: dict[str, Any], then: str | None, tq: int
    ) -> tuple[EnqueueParams, m.Task]:
        """The broker's and the model's task for one set of drawn options."""
        spec = None
        headers = {}
        if then is not None:
            spec = m.Then(self.queues[tq], on_archived=then == "finished")
            resolved = continuations.Then(
                "model:then",
                queue=spec.queue,
                on_archived=spec.on_archived,
                max_retry=spec.max_retry,
                retention=spec.retention,
            )
            headers[continuations.HEADER] = continuations.resolve(resolved, queue, _NO_APP)
        unique = f"u:{queue}" if o["unique"] else None
        params = EnqueueParams(
            id=task_id,
            queue=queue,
            type="model:task",
            payload=json.dumps({"id": task_id}).encode(),
            max_retry=o["max_retry"],
            retention=float(o["retention"]),
            priority=o["priority"],
            process_in=float(o["delay"]) or None,
            unique_key=unique,
            unique_ttl=20.0 if unique else None,
            headers=headers,
            limits=LIMITS[o["limit"]],
        )
        task = m.Task(
            queue=queue,
            id=task_id,
            state=m.SCHEDULED if o["delay"] > 0 else m.PENDING,
            priority=o["priority"],
            due=float(o["delay"]),
            seq=0,
            max_retry=o["max_retry"],
            retention=float(o["retention"]),
            limits={
                s.key: (s.concurrency, s.rate, s.per, s.cost, s.sequence)
                for s in LIMITS[o["limit"]]
            },
            fair=next((s.fair for s in LIMITS[o["limit"]] if s.fair is not None), None),
            unique=unique,
            unique_until=20.0 if unique else None,
            then=spec,
        )
        return params, task

    @rule(
        q=st.integers(0, 1),
        task_id=st.sampled_from(IDS),
        options=task_options,
        then=st.sampled_from(THEN),
        then_q=st.integers(0, 1),
    )
    def enqueue(
        self, q: int, task_id: str, options: dict[str, Any], then: str | None, then_q: int
    ) -> None:
        queue = self.queues[q]
        params, task = self._params(queue, task_id, options, then, then_q)
        self._enqueue_both(params, task)

    @rule(
        q=st.integers(0, 1),
        ids=st.lists(st.sampled_from(IDS), min_size=2, max_size=4, unique=True),
        late=st.sampled_from(["fb", "fck"]),
    )
    def enqueue_fair_backlog(self, q: int, ids: list[str], late: str) -> None:
        """W22: a backlog of one partition, then a task of another, at one priority: the
        claims that follow take the late partition's task before the backlog's second."""
        for i, task_id in enumerate(ids):
            limit = late if i == len(ids) - 1 else "fa"
            options = {"priority": 0, "delay": 0, "max_retry": 1, "retention": 0}
            self.enqueue(q, task_id, {**options, "limit": limit, "unique": False}, None, 0)

    @rule(
        q=st.integers(0, 1),
        ids=st.lists(st.sampled_from(IDS), min_size=2, max_size=3, unique=True),
        limit=st.sampled_from(["s", "sr", "rs", "sk", "ks"]),
    )
    def enqueue_sequence(self, q: int, ids: list[str], limit: str) -> None:
        """W25: tasks of one sequence with retries to spend, so that claims meet a key kept
        by a task that failed, waits or was handed back, and inspector moves free it."""
        options = {"priority": 0, "delay": 0, "max_retry": 2, "retention": 0, "unique": False}
        for task_id in ids:
            self.enqueue(q, task_id, {**options, "limit": limit}, None, 0)

    @rule(
        q=st.integers(0, 1),
        task_id=st.sampled_from(IDS),
        options=task_options,
        after=st.lists(st.sampled_from(IDS), min_size=1, max_size=2, unique=True),
    )
    def enqueue_after(
        self, q: int, task_id: str, options: dict[str, Any], after: list[str]
    ) -> None:
        """A task that waits for others of its queue (W15)."""
        queue = self.queues[q]
        after = [a for a in after if a != task_id]
        params, task = self._params(queue, task_id, options, None, q)
        params = dataclasses.replace(params, after=tuple((queue, a) for a in after))
        self._enqueue_both(params, task, tuple(after))

    @initialize(
        tasks=st.lists(
            st.tuples(
                st.integers(0, 1),
                st.sampled_from(IDS),
                task_options,
                st.sampled_from(THEN),
                st.integers(0, 1),
            ),
            max_size=8,
        )
    )
    def enqueue_first(self, tasks: list[tuple[int, str, dict[str, Any], str | None, int]]) -> None:
        """A backlog to start from, so that claims meet held tasks and full keys often."""
        for q, task_id, options, then, then_q in tasks:
            self.enqueue(q, task_id, options, then, then_q)

    def _enqueue_both(
        self, params: EnqueueParams, task: m.Task, after: tuple[str, ...] = ()
    ) -> None:
        """Enqueue on the broker and in the model; both refuse alike or create alike."""
        got = self._refusal(self.broker.enqueue(params))
        try:
            self.model.enqueue(
                task.queue,
                task.id,
                priority=task.priority,
                delay=task.due,
                max_retry=task.max_retry,
                retention=task.retention,
                limits=task.limits,
                fair=task.fair,
                unique=task.unique,
                unique_ttl=task.unique_until,
                then=task.then,
                after=after,
            )
            want = "created"
        except m.Refused as exc:
            want = exc.reason
        self.seen.add(task.key)
        assert got == want

    def _refusal(self, coro: Any) -> str:
        try:
            self.call(coro)
        except TaskIDConflictError:
            return "conflict"
        except DuplicateTaskError:
            return "duplicate"
        return "created"

    @rule(
        members=st.lists(
            st.tuples(st.integers(0, 1), st.sampled_from(IDS), task_options),
            min_size=1,
            max_size=3,
            unique_by=lambda x: (x[0], x[1]),
        ),
        then=st.booleans(),
        then_q=st.integers(0, 1),
    )
    def enqueue_group(
        self, members: list[tuple[int, str, dict[str, Any]]], then: bool, then_q: int
    ) -> None:
        if CAP_CROSS_QUEUE_GROUPS not in self.broker.capabilities:
            # One hash slot per script: the group, its members and follow-up in one queue.
            members = [(members[0][0], task_id, o) for _, task_id, o in members]
            members = list({task_id: (q, task_id, o) for q, task_id, o in members}.values())
            then_q = members[0][0]
        group_id = f"g{self.groups}"
        self.groups += 1
        built = [self._params(self.queues[q], task_id, o, None, 0) for q, task_id, o in members]
        fan_in = continuations.Then("model:fanin", queue=self.queues[then_q], max_retry=0)
        params = groups.build(
            group_id,
            [p for p, _ in built],
            fan_in if then else None,
            _NO_APP,
            retention=3600.0,
            max_payload=1024 * 1024,
        )
        got = self._refusal(self.broker.enqueue_group(params))
        try:
            self.model.enqueue_group(
                group_id, [t for _, t in built], self.queues[then_q] if then else None
            )
            want = "created"
        except m.Refused as exc:
            want = exc.reason
        self.seen.update(t.key for _, t in built)
        if then and want == "created":
            self.seen.add((self.queues[then_q], f"group:{group_id}"))  # waiting from now
        assert got == want

    @rule(
        nodes=st.lists(
            st.tuples(st.integers(0, 1), st.sampled_from(IDS), task_options, _AFTER),
            min_size=1,
            max_size=4,
        )
    )
    def enqueue_graph(self, nodes: list[tuple[int, str, dict[str, Any], list[int]]]) -> None:
        """A workflow: its tasks all or none, each waiting for earlier ones it names."""
        if CAP_CROSS_QUEUE_GROUPS not in self.broker.capabilities:
            nodes = [(nodes[0][0], task_id, o, e) for _, task_id, o, e in nodes]
        built = [self._params(self.queues[q], task_id, o, None, 0) for q, task_id, o, _ in nodes]
        edges = [tuple(j for j in e if j < i) for i, (*_, e) in enumerate(nodes)]
        items = [
            dataclasses.replace(p, after=tuple((built[j][0].queue, built[j][0].id) for j in e))
            for (p, _), e in zip(built, edges, strict=True)
        ]
        got = self._refusal(self.broker.enqueue_graph(items))
        try:
            self.model.enqueue_graph(
                [(t, tuple(dict.fromkeys(e))) for (_, t), e in zip(built, edges, strict=True)]
            )
            want = "created"
        except m.Refused as exc:
            want = exc.reason
        self.seen.update(t.key for _, t in built)
        assert got == want

    # -- claim and the end of an attempt -------------------------------------------------------

    @rule(
        weights=st.tuples(st.integers(1, 3), st.integers(1, 3)),
        strict=st.booleans(),
        seed=st.integers(0, 2**16),
        limit=st.integers(1, 3),
    )
    def claim(self, weights: tuple[int, int], strict: bool, seed: int, limit: int) -> None:
        """A worker's claim: its queues in the order its weights draw, then the broker's."""
        by_weight = dict(zip(self.queues, weights, strict=True))
        queues = queue_order(by_weight, strict, random.Random(seed))
        expected = m.queue_order(by_weight, strict)
        assert queues == expected if expected is not None else sorted(queues) == self.queues
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
        if len(taken) < limit:
            # A claim that came back short says when to look again for a task held on a
            # rate: not later than the model's next token (earlier is a spurious wake-up).
            wake = self.model.wake_at(queues)
            if wake is not None:
                got = getattr(leases, "wake_at", None)
                assert got is not None and got <= wake + 1e-6, (got, wake)

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
        assert got == self.model.complete(lease.ref.task_key, token)

    @rule(
        index=st.integers(0, 5),
        stale=st.booleans(),
        delay=st.sampled_from([0, 10]),
        name=st.sampled_from(["a", "b"]),
    )
    def wait(self, index: int, stale: bool, delay: int, name: str) -> None:
        """The handler waits for a signal (ctx.wait_for): a snooze a signal ends (W19)."""
        taken = self._take(index, stale)
        if taken is None:
            return
        lease, token = taken
        got = self.call(self.broker.retry(lifecycle.slept(lease, float(delay), awaits=name)))
        assert got == self.model.wait(lease.ref.task_key, token, delay, name)

    @rule(
        q=st.integers(0, 1),
        which=st.integers(0, len(IDS) - 1),
        states=st.sampled_from([("active",), ("pending", "scheduled"), ("retry", "active")]),
    )
    def free_unique(self, q: int, which: int, states: tuple[str, ...]) -> None:
        queue = self.queues[q]
        key = (queue, IDS[which])
        release = UniqueRelease(*key, f"u:{queue}", tuple(TaskState(s) for s in states))
        got = self.call(self.broker.free_unique(release))
        assert got == self.model.free_unique(key, f"u:{queue}", states), key

    @rule(
        q=st.integers(0, 1),
        which=st.integers(0, len(IDS) - 1),
        delay=st.sampled_from([None, 0, 7, 30]),
        priority=st.sampled_from([None, 3]),
    )
    def replace_twin(self, q: int, which: int, delay: int | None, priority: int | None) -> None:
        queue = self.queues[q]
        key = (queue, IDS[which])
        payload = json.dumps({"id": IDS[which]}).encode()  # the model keeps no payloads
        wait = None if delay is None else float(delay)
        change = TwinReplace(*key, f"u:{queue}", payload, delay=wait, priority=priority)
        got = self.call(self.broker.replace_twin(change))
        assert (got is not None) == self.model.replace_twin(key, f"u:{queue}", wait, priority)

    @rule(q=st.integers(0, 1), which=st.integers(0, len(IDS) - 1), name=st.sampled_from(["a", "b"]))
    def signal(self, q: int, which: int, name: str) -> None:
        key = (self.queues[q], IDS[which])
        try:
            got = self.call(self.broker.signal(SignalParams(*key, name, '"x"')))
        except TaskNotFoundError:
            got = "not found"
        try:
            want = self.model.signal(key, name)
        except m.Refused as exc:
            want = exc.reason
        assert got == want, key

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
        if lease.task.retried >= lease.task.max_retry:
            # The decision was made on the attempt's copy: it archives (the model agrees
            # whenever the fence holds, since a held lease's task has not moved since).
            assert not isinstance(move, RetryParams)
        assert got == self.model.fail(lease.ref.task_key, token, float(delay), "boom")

    @rule(index=st.integers(0, 5), stale=st.booleans(), cancelled=st.booleans())
    def give_up(self, index: int, stale: bool, cancelled: bool) -> None:
        """SkipRetry, or a handler cancelled on the inspector's request (not counted)."""
        taken = self._take(index, stale)
        if taken is None:
            return
        lease, token = taken
        error = lifecycle.CANCELLED if cancelled else "skip"
        move = lifecycle.gave_up(lease, error, now=self.clock.now(), count_attempt=not cancelled)
        got = self.call(self.broker.archive(move))
        assert got == self.model.give_up(lease.ref.task_key, token, error, not cancelled)

    @rule(index=st.integers(0, 5), stale=st.booleans())
    def hand_back(self, index: int, stale: bool) -> None:
        taken = self._take(index, stale)
        if taken is None:
            return
        lease, token = taken
        got = self.call(self.broker.requeue(lease.ref, keep=lifecycle.keeps_key(lease.task)))
        assert got == self.model.requeue(lease.ref.task_key, token)

    @rule()
    def heartbeat(self) -> None:
        held = list(self.held.values())
        if not held:
            return
        report = self.call(self.broker.extend_leases([lease.ref for lease, _ in held], LEASE))
        lost, cancel = self.model.extend(
            [(lease.ref.task_key, token) for lease, token in held], LEASE
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

    @rule(
        default=st.sampled_from([None, 0, 40]),
        second=st.sampled_from(["same", None, 10]),
    )
    def delete_archived(self, default: float | None, second: float | str | None) -> None:
        """The janitor's archived retention: a default, and maybe another for one queue."""
        keep = {q: default for q in self.queues}
        overrides = {}
        if second != "same":
            keep[self.queues[1]] = overrides[self.queues[1]] = second  # type: ignore[assignment]
        retention = ArchivedRetention(default, overrides)  # type: ignore[arg-type]
        self.call(self.broker.delete_archived(retention, 10_000))
        self.model.delete_archived(keep)

    # -- the inspector -------------------------------------------------------------------------

    @rule(
        action=st.sampled_from(["run", "archive", "delete", "cancel"]),
        q=st.integers(0, 1),
        which=st.integers(0, len(IDS) + 3),
    )
    def inspect(self, action: str, q: int, which: int) -> None:
        """One of the ids of the enqueues, or of a follow-up an outcome created."""
        follow_ups = sorted(k for k in self.seen if k[1] not in IDS)
        if which < len(IDS) or not follow_ups:
            queue, task_id = self.queues[q], IDS[which % len(IDS)]
        else:
            queue, task_id = follow_ups[which % len(follow_ups)]
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
            self.model.pause(queue, paused, known=got == "ok")
            want = "ok"
        except m.Refused as exc:
            want = exc.reason
        assert got == want

    @rule(
        q=st.integers(0, 1),
        key=st.sampled_from(["k", "r", "f:a", "f:b", "z"]),
        concurrency=st.sampled_from([None, 0, 1, 3]),
        rate=st.sampled_from([None, (1, 10.0), (3, 10.0)]),
    )
    def set_limit(
        self, q: int, key: str, concurrency: int | None, rate: tuple[int, float] | None
    ) -> None:
        """W23: an operator overrides a key's limit ("z": a key no task carries)."""
        if concurrency is None and rate is None:
            concurrency = 2
        queue = self.queues[q]
        rate_n, per = rate if rate is not None else (None, None)
        try:
            self.call(
                self.broker.admin.set_limit(LimitOverride(queue, key, concurrency, rate_n, per))
            )
            got = "ok"
        except QueueNotFoundError:
            got = "no queue"
        try:
            self.model.set_limit(queue, key, concurrency, rate, known=got == "ok")
            want = "ok"
        except m.Refused as exc:
            want = exc.reason
        assert got == want

    @rule(q=st.integers(0, 1), key=st.sampled_from(["k", "r", "f:a", "z"]))
    def reset_limit(self, q: int, key: str) -> None:
        """W23: the override goes; the tasks' own limit applies again."""
        queue = self.queues[q]
        got = self.call(self.broker.admin.reset_limit(queue, key))
        assert got == self.model.reset_limit(queue, key)

    # -- what every task, key and group looks like after each step -----------------------------

    @invariant()
    def follow_ups_as_the_model_says(self) -> None:
        """Each follow-up the model created exists, reporting the outcomes it follows."""
        for queue, task_id, want in self.model.created:
            self.seen.add((queue, task_id))
            info = self.call(self.broker.admin.get_task(queue, task_id))
            body = json.loads(info.raw_payload)
            if "members" in want:
                got: dict[str, object] = {
                    "members": [
                        (e["queue"], e["id"], e["state"], e.get("error")) for e in body["members"]
                    ]
                }
            else:
                got = {"of": body["task"]["id"], "state": body["task"]["state"]}
                got["error"] = body.get("error")
            assert got == want, (queue, task_id)
        self.model.created.clear()

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
                if state in m.CLAIMABLE and due:
                    state = "due"
                got = (state, info.retried, info.lost, info.held_by)
            want = self.model.observe(key)
            task = self.model.tasks.get(key)
            if got is not None and want is not None and want[3] is None and task is not None:
                if got[3] is not None and got[3] == task.lingering:
                    want = (*want[:3], task.lingering)
            assert got == want, key

    @invariant()
    def every_key_as_the_model_says(self) -> None:
        """Running attempts, tokens and held tasks of each key a claim counted or held on; a
        key a broker shows beyond those has nothing running or held."""
        for queue in self.queues:
            want = self.model.limit_stats(queue)
            if not want:
                continue  # a task a broker held on another key shows in its held_by
            stats = self.call(self.broker.admin.list_limits(queue))
            got = {
                s.key: (
                    s.running,
                    s.tokens,
                    s.waiting,
                    (
                        s.override_concurrency,
                        None if s.override_rate is None else (s.override_rate, s.override_per),
                    ),
                )
                for s in stats
                if s.key in want
            }
            for key, (running, tokens, held, lingering, override) in want.items():
                assert key in got, (queue, key)
                g_running, g_tokens, g_waiting, g_override = got[key]
                assert g_running == running, (queue, key)
                assert g_override == override, (queue, key)
                assert held <= g_waiting <= held + lingering, (queue, key, g_waiting, held)
                if tokens == m.UNSEEN:
                    continue
                assert (g_tokens is None) == (tokens is None), (queue, key)
                if tokens is not None:
                    assert abs(g_tokens - tokens) < 1e-6, (queue, key, g_tokens, tokens)
            for s in stats:
                if s.key not in want:
                    assert (s.running, s.waiting, s.overridden) == (0, 0, False), s

    @invariant()
    def every_group_as_the_model_says(self) -> None:
        for (queue, group_id), group in sorted(self.model.groups.items()):
            try:
                info = self.call(self.broker.admin.get_group(queue, group_id))
            except GroupNotFoundError:
                got = None
            else:
                got = (info.total, info.finished, info.finished_at is not None, info.then_id)
            then_id = None if group.then is None else f"group:{group_id}"
            want = (len(group.members), group.finished, group.finished_at is not None, then_id)
            assert got == want, (queue, group_id)


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


@pytest.mark.timeout(120 + 10 * EXAMPLES)  # seconds: thousands of sequences in ``make model``
def test_every_broker_answers_as_the_model(machine: type[BrokerAgainstModel]) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            report_multiple_bugs=False,
            # DURQ_MODEL_SHRINK=0: report the first failing sequence as found (minutes sooner).
            phases=[p for p in Phase if p is not Phase.shrink or SHRINK],
            suppress_health_check=list(HealthCheck),
        ),
    )


# -- sequences the long run (make model) found, kept as they were shrunk ----------------------


def _options(limit: str | None = None, delay: int = 0) -> dict[str, Any]:
    return {
        "priority": -1,
        "delay": delay,
        "max_retry": 0,
        "retention": 0,
        "limit": limit,
        "unique": False,
    }


def _checked(state: BrokerAgainstModel) -> None:
    for check in (
        state.every_task_as_the_model_says,
        state.every_key_as_the_model_says,
        state.every_group_as_the_model_says,
        state.follow_ups_as_the_model_says,
    ):
        check()


def test_a_token_for_a_held_task_keeps_the_queue_order(
    machine: type[BrokerAgainstModel],
) -> None:
    """PostgreSQL leased a later queue's new task before the earlier queue's task held on a
    rate whose token had come (the one statement of the fast claim leases first)."""
    state = machine()
    state.enqueue(0, "t0", _options("r1"), None, 0)
    state.enqueue(1, "t0", _options(delay=5), None, 0)
    state.enqueue(0, "t1", _options("r1"), None, 0)
    state.claim(limit=2, seed=0, strict=False, weights=(1, 1))
    state.claim(limit=1, seed=0, strict=False, weights=(1, 1))
    state.advance(seconds=11)
    state.claim(limit=1, seed=1, strict=False, weights=(1, 1))
    _checked(state)
    state.teardown()


def test_a_group_follow_up_is_ordered_from_the_group_s_creation(
    machine: type[BrokerAgainstModel],
) -> None:
    """The model created a group's follow-up when its last member finished, every broker
    when the group was created: which task a claim returned differed."""
    state = machine()
    state.enqueue_group(members=[(0, "t0", _options())], then=True, then_q=1)
    state.claim(limit=1, seed=0, strict=False, weights=(1, 1))
    state.enqueue(1, "t0", _options(), None, 0)
    state.complete(index=0, stale=False)
    state.claim(limit=1, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.teardown()


def test_held_tasks_are_let_back_as_far_as_their_key_has_room(
    machine: type[BrokerAgainstModel],
) -> None:
    """Found by the long run behind PgBouncer (and failing on PostgreSQL directly when replayed
    step by step): with two rates on one key, PostgreSQL let back as many held tasks as the
    claim wanted, and a task of the lower rate then found a token the key's own rate did not
    have; it now lets back as many as the key has room for, as the other brokers do."""
    state = machine()
    state.enqueue_first(
        tasks=[
            (
                0,
                "t0",
                {
                    "priority": -1,
                    "delay": 0,
                    "max_retry": 0,
                    "retention": 0,
                    "unique": False,
                    "limit": None,
                },
                None,
                0,
            ),
            (
                0,
                "t4",
                {
                    "priority": -1,
                    "max_retry": 0,
                    "retention": 0,
                    "unique": False,
                    "limit": None,
                    "delay": 0,
                },
                None,
                0,
            ),
            (
                0,
                "t0",
                {
                    "priority": -1,
                    "retention": 0,
                    "max_retry": 0,
                    "unique": False,
                    "limit": None,
                    "delay": 0,
                },
                None,
                0,
            ),
            (
                1,
                "t0",
                {
                    "priority": 0,
                    "unique": False,
                    "max_retry": 0,
                    "retention": 0,
                    "limit": "r2",
                    "delay": 5,
                },
                None,
                0,
            ),
            (
                0,
                "t0",
                {
                    "priority": -1,
                    "delay": 0,
                    "retention": 0,
                    "limit": None,
                    "max_retry": 0,
                    "unique": False,
                },
                None,
                0,
            ),
            (
                1,
                "t1",
                {
                    "priority": 1,
                    "delay": 30,
                    "retention": 0,
                    "max_retry": 0,
                    "limit": "r1",
                    "unique": False,
                },
                None,
                0,
            ),
            (
                0,
                "t0",
                {
                    "priority": -1,
                    "retention": 0,
                    "max_retry": 0,
                    "unique": False,
                    "limit": None,
                    "delay": 0,
                },
                None,
                0,
            ),
            (
                1,
                "t2",
                {
                    "priority": -1,
                    "unique": False,
                    "retention": 0,
                    "max_retry": 0,
                    "delay": 30,
                    "limit": "k1r1",
                },
                None,
                0,
            ),
        ]
    )
    state.give_up(cancelled=False, index=0, stale=False)
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.heartbeat()
    state.enqueue_group(
        members=[
            (
                0,
                "t2",
                {
                    "retention": 60,
                    "limit": None,
                    "priority": 1,
                    "delay": 30,
                    "max_retry": 1,
                    "unique": False,
                },
            ),
            (
                1,
                "t0",
                {
                    "unique": False,
                    "limit": "k2",
                    "max_retry": 0,
                    "delay": 0,
                    "priority": -1,
                    "retention": 60,
                },
            ),
            (
                0,
                "t1",
                {
                    "max_retry": 0,
                    "retention": 60,
                    "unique": True,
                    "priority": 0,
                    "delay": 0,
                    "limit": None,
                },
            ),
        ],
        then=True,
        then_q=1,
    )
    state.claim(limit=2, seed=3440, strict=True, weights=(2, 2))
    state.enqueue_group(
        members=[
            (
                0,
                "t5",
                {
                    "limit": "r1",
                    "priority": 0,
                    "delay": 0,
                    "retention": 60,
                    "unique": False,
                    "max_retry": 1,
                },
            )
        ],
        then=False,
        then_q=0,
    )
    state.enqueue_group(
        members=[
            (
                1,
                "t5",
                {
                    "unique": True,
                    "delay": 0,
                    "limit": "r2",
                    "retention": 60,
                    "priority": -1,
                    "max_retry": 2,
                },
            )
        ],
        then=False,
        then_q=0,
    )
    state.heartbeat()
    state.give_up(cancelled=False, index=4, stale=True)
    state.give_up(cancelled=False, index=3, stale=True)
    state.hand_back(index=5, stale=False)
    state.claim(limit=1, seed=13453, strict=True, weights=(2, 3))
    state.advance(seconds=31)
    state.advance(seconds=1)
    state.heartbeat()
    state.give_up(cancelled=False, index=0, stale=False)
    state.advance(seconds=31)
    state.claim(limit=1, seed=816, strict=True, weights=(3, 3))
    state.heartbeat()
    state.heartbeat()
    state.advance(seconds=11)
    state.claim(limit=2, seed=495, strict=False, weights=(2, 2))
    state.hand_back(index=1, stale=False)
    state.advance(seconds=1)
    state.enqueue_group(
        members=[
            (
                1,
                "t4",
                {
                    "delay": 0,
                    "priority": 1,
                    "limit": "k1r1",
                    "max_retry": 1,
                    "unique": False,
                    "retention": 60,
                },
            ),
            (
                1,
                "t0",
                {
                    "unique": False,
                    "max_retry": 2,
                    "retention": 0,
                    "limit": "r2",
                    "delay": 0,
                    "priority": 0,
                },
            ),
            (
                0,
                "t3",
                {
                    "unique": False,
                    "max_retry": 0,
                    "delay": 0,
                    "priority": 0,
                    "retention": 0,
                    "limit": "k1r1",
                },
            ),
        ],
        then=False,
        then_q=0,
    )
    state.advance(seconds=31)
    state.enqueue_group(
        members=[
            (
                1,
                "t2",
                {
                    "limit": None,
                    "priority": 0,
                    "retention": 0,
                    "max_retry": 0,
                    "delay": 5,
                    "unique": False,
                },
            )
        ],
        then=False,
        then_q=0,
    )
    state.enqueue_group(
        members=[
            (
                0,
                "t4",
                {
                    "delay": 30,
                    "max_retry": 2,
                    "unique": True,
                    "priority": -1,
                    "limit": "r2",
                    "retention": 60,
                },
            ),
            (
                0,
                "t2",
                {
                    "delay": 5,
                    "retention": 60,
                    "limit": "k2",
                    "unique": False,
                    "max_retry": 2,
                    "priority": 1,
                },
            ),
        ],
        then=True,
        then_q=0,
    )
    state.give_up(cancelled=True, index=2, stale=True)
    state.claim(limit=3, seed=54, strict=True, weights=(1, 3))
    state.teardown()


def test_a_new_key_s_bucket_is_full_at_the_rate_of_the_task_that_takes_first(
    machine: type[BrokerAgainstModel],
) -> None:
    """PostgreSQL made a key's first counter with the rate of the first task its statement
    read (t5's, 1 per 10 s), not of the first task in claim order (t2's, 2 per 10 s): t2 took
    the only token and t5, which the model starts, was held."""
    state = machine()
    state.enqueue_graph(nodes=[(1, "t2", _options("r2", delay=30), [])])
    state.enqueue_group(
        members=[
            (0, "t3", _options("r2")),
            (1, "t5", {**_options("k1r1", delay=5), "unique": True}),
            (0, "t4", {**_options("k1"), "priority": 1}),
        ],
        then=True,
        then_q=0,
    )
    state.advance(seconds=5)
    state.claim(limit=2, seed=609, strict=True, weights=(3, 3))
    state.inspect(action="run", q=1, which=2)
    state.claim(limit=3, seed=23573, strict=False, weights=(3, 3))


def test_W22_partitions_of_a_fair_key_take_turns(machine: type[BrokerAgainstModel]) -> None:
    """Two tasks of one partition, then one of another: the claim takes the second partition
    before the first one's second task, and a partition new to the line after a round has
    gone waits no longer than one turn."""
    state = machine()
    for task_id, limit in (("t0", "fa"), ("t1", "fa"), ("t2", "fa"), ("t3", "fb")):
        state.enqueue(0, task_id, {**_options(limit), "priority": 0}, None, 0)
    state.claim(limit=1, seed=0, strict=False, weights=(1, 1))
    state.claim(limit=1, seed=0, strict=False, weights=(1, 1))
    state.complete(index=0, stale=False)
    state.enqueue(0, "t4", {**_options("fck"), "priority": 0}, None, 0)
    state.claim(limit=3, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.teardown()


def test_W24_a_held_task_of_cost_waits_for_its_units(machine: type[BrokerAgainstModel]) -> None:
    """Two tasks take one slot each of "k"; one of cost 2 is held. One slot freed is not
    enough (it stays held); both are. On "r", two tokens spent by one task of cost 2: a
    second waits for both to come back, not for the first."""
    state = machine()
    for task_id, limit in (("t0", "k2"), ("t1", "k2"), ("t2", "k2c2"), ("t3", "r2c2")):
        state.enqueue(0, task_id, _options(limit), None, 0)
    state.enqueue(0, "t4", _options("r2c2"), None, 0)
    state.claim(limit=3, seed=0, strict=False, weights=(1, 1))
    state.claim(limit=3, seed=0, strict=False, weights=(1, 1))
    state.complete(index=0, stale=False)
    state.claim(limit=3, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.advance(seconds=5)
    state.claim(limit=3, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.complete(index=0, stale=False)
    state.advance(seconds=5)
    state.claim(limit=3, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.teardown()


def test_W25_a_sequence_s_key_stays_with_its_task_until_it_finishes(
    machine: type[BrokerAgainstModel],
) -> None:
    """A task of a sequence fails and waits for its retry: the next task of the key is held
    although nothing runs; the retry starts before it. Archived by the inspector while it
    waits for a second retry, it gives the key back and the next one starts."""
    state = machine()
    state.enqueue(0, "t0", {**_options("s"), "max_retry": 2}, None, 0)
    state.enqueue(0, "t1", _options("s"), None, 0)
    state.claim(limit=2, seed=0, strict=False, weights=(1, 1))
    state.fail(index=0, stale=False, delay=10)
    state.claim(limit=2, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.advance(seconds=11)
    state.claim(limit=2, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.fail(index=0, stale=False, delay=10)
    state.inspect(action="archive", q=0, which=0)
    _checked(state)
    state.claim(limit=2, seed=0, strict=False, weights=(1, 1))
    _checked(state)
    state.teardown()


def test_W23_an_override_wins_until_it_is_reset(machine: type[BrokerAgainstModel]) -> None:
    """A key held at 0 by an override starts nothing (other keys flow), a raise lets its held
    tasks back as far as it allows, a rate set on a key no task carries starts from a full
    bucket, and a reset goes back to the tasks' own limit."""
    state = machine()
    for task_id in ("t0", "t1", "t2"):
        state.enqueue(0, task_id, _options("k2"), None, 0)
    state.enqueue(0, "t3", _options("r1"), None, 0)
    state.set_limit(q=0, key="k", concurrency=0, rate=None)
    state.claim(limit=3, seed=0, strict=True, weights=(1, 1))
    state.set_limit(q=0, key="k", concurrency=1, rate=(3, 10.0))
    state.claim(limit=3, seed=0, strict=True, weights=(1, 1))
    state.set_limit(q=1, key="z", concurrency=None, rate=(1, 10.0))
    state.reset_limit(q=0, key="k")
    state.claim(limit=3, seed=0, strict=True, weights=(1, 1))
    state.reset_limit(q=0, key="k")
    _checked(state)
    state.teardown()


def test_W23_an_override_of_a_key_only_looked_at(machine: type[BrokerAgainstModel]) -> None:
    """Found by the long run on PostgreSQL: a claim made the counter of "r" for a task it
    then held on "k" (with that task's rate, as its limiter makes a counter), the model had
    none; an override of "r" made the model's, with no rate: the tokens shown differed. A
    key no task has started shows a rate or none as its broker saw it."""
    state = machine()
    state.enqueue(0, "t0", _options("k1"), None, 0)
    state.claim(limit=1, seed=0, strict=True, weights=(1, 1))
    state.enqueue(0, "t1", _options("r1k1"), None, 0)
    state.claim(limit=1, seed=0, strict=True, weights=(1, 1))
    state.set_limit(q=0, key="r", concurrency=2, rate=None)
    _checked(state)
    state.complete(index=0, stale=False)
    state.claim(limit=1, seed=0, strict=True, weights=(1, 1))
    _checked(state)
    state.teardown()
