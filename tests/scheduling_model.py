"""The scheduling rules of durq as one small executable model: what every broker must answer.

Plain Python, no storage, no speed: a dict of tasks and a clock. It states the rules of
``docs/contract.md`` that decide *which task runs when* — claim order (W8), delays and due
times (E2), one task per id (E3), uniqueness by content (E4), leases and fencing (W1),
retries (W4), rescue of expired leases, the inspector's moves (I3), pausing (I4), per-key
concurrency limits (W13) and retention (E5) — and nothing about how a broker stores them.

``tests/conformance/test_model.py`` drives every broker and this model with the same random
steps (hypothesis) and compares their answers step by step. The memory broker is checked
against the model like the others rather than being it: it is a production broker with
indexes, holds and wake-ups of its own, and the model must stay readable in one sitting.

Times are seconds on the test's clock. Observable states: a waiting task that is due is
reported as ``"due"`` whatever its stored state (``pending``, or ``scheduled``/``retry``
not yet forwarded), since brokers forward due tasks at different moments.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

PENDING, SCHEDULED, ACTIVE, RETRY, ARCHIVED, COMPLETED = (
    "pending",
    "scheduled",
    "active",
    "retry",
    "archived",
    "completed",
)
WAITING = (PENDING, SCHEDULED, RETRY)
LEASE_EXPIRED = "lease expired"
WORKER_LOST = "worker lost"
CANCELLED = "cancelled"


class Refused(Exception):
    """The model refuses the operation; ``reason`` names the broker's answer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Task:
    queue: str
    id: str
    state: str
    priority: int
    due: float
    seq: int
    max_retry: int
    retention: float
    #: key -> (concurrency, rate, per); ``None`` where the limit has no such part.
    limits: dict[str, tuple[int | None, int | None, float | None]] = field(default_factory=dict)
    unique: str | None = None
    unique_until: float | None = None
    retried: int = 0
    lost: int = 0
    token: str | None = None
    lease_until: float | None = None
    expires_at: float | None = None
    cancel_requested: bool = False
    last_error: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.queue, self.id)


@dataclass
class Model:
    now: float
    max_lost: int = 3
    tasks: dict[tuple[str, str], Task] = field(default_factory=dict)
    queues: set[str] = field(default_factory=set)
    #: Token buckets of rate limits, per (queue, key): (tokens, refilled at).
    buckets: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _tokens: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- reading ------------------------------------------------------------------------------

    def live(self, key: tuple[str, str]) -> Task | None:
        """The task, unless absent or completed past its retention (E3: gone)."""
        task = self.tasks.get(key)
        if task is None:
            return None
        if task.state == COMPLETED and task.expires_at is not None and task.expires_at <= self.now:
            return None
        return task

    def observe(self, key: tuple[str, str]) -> tuple[str, int, int] | None:
        """(state, retried, lost) as a broker reports it; ``None``: no such task."""
        task = self.live(key)
        if task is None:
            return None
        state = task.state
        if state in WAITING and task.due <= self.now:
            state = "due"
        return (state, task.retried, task.lost)

    def running(self, queue: str, limit_key: str) -> int:
        return sum(
            1
            for t in self.tasks.values()
            if t.queue == queue and t.state == ACTIVE and limit_key in t.limits
        )

    # -- enqueue (E2, E3, E4) -----------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        task_id: str,
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_retry: int = 25,
        retention: float = 0.0,
        limits: dict[str, tuple[int | None, int | None, float | None]] | None = None,
        unique: str | None = None,
        unique_ttl: float | None = None,
    ) -> Task:
        """Create a task, or raise Refused("conflict") / Refused("duplicate")."""
        if self.live((queue, task_id)) is not None:
            raise Refused("conflict")  # E3, checked before E4
        if unique is not None and self._unique_holder(queue, unique) is not None:
            raise Refused("duplicate")
        task = Task(
            queue=queue,
            id=task_id,
            state=SCHEDULED if delay > 0 else PENDING,
            priority=priority,
            due=self.now + delay,
            seq=next(self._seq),
            max_retry=max_retry,
            retention=retention,
            limits=dict(limits or {}),
            unique=unique,
            unique_until=None if unique is None or unique_ttl is None else self.now + unique_ttl,
        )
        self.tasks[task.key] = task
        self.queues.add(queue)
        return task

    def _unique_holder(self, queue: str, unique: str) -> Task | None:
        """E4: the key holds while its task waits or runs, until its ttl passes."""
        for task in self.tasks.values():
            if task.queue != queue or task.unique != unique:
                continue
            if task.unique_until is not None and task.unique_until <= self.now:
                continue
            return task
        return None

    # -- claim (W1, W8, W13, I4) --------------------------------------------------------------

    def promote(self) -> None:
        """E2: due scheduled and retry tasks become pending (a claim forwards them first;
        before that the inspector still sees, and may run, a due scheduled task)."""
        for task in self.tasks.values():
            if task.state in (SCHEDULED, RETRY) and task.due <= self.now:
                task.state = PENDING

    def claim_order(self, queue: str) -> list[Task]:
        """Due waiting tasks of ``queue``: higher priority, then due time, then enqueue order."""
        due = [
            t
            for t in self.tasks.values()
            if t.queue == queue and t.state in WAITING and t.due <= self.now
        ]
        return sorted(due, key=lambda t: (-t.priority, t.due, t.seq))

    def claim(self, queues: list[str], limit: int, lease: float) -> list[Task]:
        """Up to ``limit`` tasks, filling from ``queues`` in the order given; a task whose
        limit keys have no room is skipped, and never blocks the tasks behind it."""
        self.promote()
        taken: list[Task] = []
        for queue in queues:
            if queue in self.paused:
                continue
            for task in self.claim_order(queue):
                if len(taken) == limit:
                    return taken
                if not all(self._admits(queue, k, spec) for k, spec in task.limits.items()):
                    continue
                for key, (_, rate, per) in task.limits.items():
                    if rate is not None and per is not None:
                        self.buckets[(queue, key)] = (
                            self._tokens_at(queue, key, rate, per) - 1,
                            self.now,
                        )
                task.state = ACTIVE
                task.token = f"t{next(self._tokens)}"
                task.lease_until = self.now + lease
                task.cancel_requested = False
                taken.append(task)
        return taken

    def _admits(
        self, queue: str, key: str, spec: tuple[int | None, int | None, float | None]
    ) -> bool:
        """W13: a slot (fewer than ``concurrency`` running) and a token in the key's bucket."""
        concurrency, rate, per = spec
        if concurrency is not None and self.running(queue, key) >= concurrency:
            return False
        if rate is None or per is None:
            return True
        return self._tokens_at(queue, key, rate, per) >= 1 - 1e-9

    def _tokens_at(self, queue: str, key: str, rate: int, per: float) -> float:
        """The bucket holds up to ``rate`` tokens (full at first) and gains ``rate / per`` a
        second on the broker's clock."""
        tokens, at = self.buckets.get((queue, key), (float(rate), self.now))
        return min(float(rate), tokens + (self.now - at) * rate / per)

    # -- the end of an attempt (W1, W4): fenced by the lease's token -------------------------

    def _held(self, key: tuple[str, str], token: str) -> Task | None:
        task = self.tasks.get(key)
        if task is None or task.state != ACTIVE or task.token != token:
            return None
        return task

    def complete(self, key: tuple[str, str], token: str) -> bool:
        task = self._held(key, token)
        if task is None:
            return False
        if task.retention <= 0:
            del self.tasks[key]
        else:
            self._end(task, COMPLETED)
            task.expires_at = self.now + task.retention
        return True

    def fail(self, key: tuple[str, str], token: str, delay: float, error: str) -> bool:
        """Retry after ``delay``, or archived once the retries are used up."""
        task = self._held(key, token)
        if task is None:
            return False
        task.last_error = error
        if task.retried >= task.max_retry:
            self._end(task, ARCHIVED)
        else:
            self._end(task, RETRY)
            task.due = self.now + delay
        task.retried += 1
        return True

    def requeue(self, key: tuple[str, str], token: str) -> bool:
        """Handed back at shutdown: pending now, the attempt not counted."""
        task = self._held(key, token)
        if task is None:
            return False
        self._end(task, PENDING)
        task.due = self.now
        return True

    def _end(self, task: Task, state: str) -> None:
        task.state = state
        task.token = None
        task.lease_until = None
        task.cancel_requested = False
        if state in (COMPLETED, ARCHIVED):
            task.unique = None  # E4: a finished task frees its key

    # -- heartbeats and the rescuer ----------------------------------------------------------

    def extend(
        self, held: list[tuple[tuple[str, str], str]], lease: float
    ) -> tuple[set[str], set[str]]:
        """Extend the leases still held; the ids of (leases lost, tasks asked to cancel)."""
        lost, cancel = set(), set()
        for key, token in held:
            task = self._held(key, token)
            if task is None:
                lost.add(key[1])
                continue
            task.lease_until = self.now + lease
            if task.cancel_requested:
                cancel.add(key[1])
        return lost, cancel

    def rescue(self) -> list[tuple[str, str]]:
        """Every expired lease: retry due now (an attempt and a loss counted), or archived
        when lost ``max_lost`` times or out of retries."""
        moved = []
        for task in self.tasks.values():
            if task.state != ACTIVE or task.lease_until is None or task.lease_until > self.now:
                continue
            if task.lost + 1 >= self.max_lost:
                self._end(task, ARCHIVED)
                task.last_error = WORKER_LOST
            elif task.retried >= task.max_retry:
                self._end(task, ARCHIVED)
                task.last_error = LEASE_EXPIRED
            else:
                self._end(task, RETRY)
                task.due = self.now
                task.last_error = LEASE_EXPIRED
            task.retried += 1
            task.lost += 1
            moved.append(task.key)
        return moved

    # -- the inspector (I3, I4) ---------------------------------------------------------------

    def run(self, key: tuple[str, str]) -> None:
        """scheduled/retry/archived -> pending now."""
        task = self._found(key)
        if task.state not in (SCHEDULED, RETRY, ARCHIVED):
            raise Refused("invalid state")
        task.state = PENDING
        task.due = self.now
        task.lost = 0

    def archive(self, key: tuple[str, str]) -> None:
        task = self._found(key)
        if task.state not in WAITING:
            raise Refused("invalid state")
        self._end(task, ARCHIVED)

    def delete(self, key: tuple[str, str]) -> None:
        task = self._found(key)
        if task.state == ACTIVE:
            raise Refused("invalid state")
        del self.tasks[key]

    def cancel(self, key: tuple[str, str]) -> None:
        """Waiting: archived "cancelled" at once. Active: flagged for its worker."""
        task = self._found(key)
        if task.state in WAITING:
            self._end(task, ARCHIVED)
            task.last_error = CANCELLED
        elif task.state == ACTIVE:
            task.cancel_requested = True
        else:
            raise Refused("invalid state")

    def pause(self, queue: str, paused: bool) -> None:
        """I4: a paused queue hands out nothing and still takes enqueues. A queue exists
        once a task was enqueued in it."""
        if queue not in self.queues:
            raise Refused("no queue")
        if paused:
            self.paused.add(queue)
        else:
            self.paused.discard(queue)

    def _found(self, key: tuple[str, str]) -> Task:
        task = self.live(key)
        if task is None:
            raise Refused("not found")
        return task

    # -- time and the janitor -----------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def janitor(self) -> None:
        """Completed tasks past their retention are deleted (already gone to readers)."""
        for key in [k for k in self.tasks if self.live(k) is None]:
            del self.tasks[key]
