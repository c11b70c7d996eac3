"""The scheduling rules of durq as one small executable model: what every broker must answer.

Plain Python, no storage, no speed: a dict of tasks and a clock. It states the rules of
``docs/contract.md`` that decide *which task runs when* and what an outcome creates — claim
order (W8: queues in the order a worker takes them, then priority, due time, enqueue
order), delays and due times (E2), one task per id (E3), uniqueness by content (E4), leases
and fencing (W1), retries (W4), rescue of expired leases, the inspector's moves (I3),
pausing (I4), per-key flow control with held tasks (W13), fair keys that take turns
(W22), strict sequences that a task keeps until it finishes (W25) and an operator's
overrides of a key's limit (W23), continuations and group fan-in,
tasks that wait for others (W15), signals and the waits they end (W19), and retention of
completed and archived tasks (E5) — and nothing about how a broker stores them.

``tests/conformance/test_model.py`` drives every broker and this model with the same random
steps (hypothesis) and compares their answers step by step. The memory broker is checked
against the model like the others rather than being it: it is a production broker with
indexes, holds and wake-ups of its own, and the model must stay readable in one sitting.

Times are seconds on the test's clock. Observable states: a claimable task that is due is
reported as ``"due"`` whatever its stored state (``pending``, or ``scheduled``/``retry``
not yet forwarded), since brokers forward due tasks at different moments.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

PENDING, SCHEDULED, ACTIVE, RETRY, ARCHIVED, COMPLETED = (
    "pending",
    "scheduled",
    "active",
    "retry",
    "archived",
    "completed",
)
#: States a claim takes a task from once it is due.
CLAIMABLE = (PENDING, SCHEDULED, RETRY)
#: Enqueued ``after=`` others that have not all finished (W15): never claimed.
WAITING = "waiting"
DELETED = "deleted"  # a group member deleted before it finished
LEASE_EXPIRED = "lease expired"
WORKER_LOST = "worker lost"
CANCELLED = "cancelled"

#: The tokens of a key no task has started (see :meth:`Model.limit_stats`).
UNSEEN = "unseen"
#: A limit as a task stores it: (concurrency, rate, per, cost, sequence); ``None`` where it
#: has no such part. W24: one attempt takes ``cost`` units of the key's slots and tokens.
#: W25: a sequence's key stays the task's from its first start until it finishes.
Spec = tuple[int | None, int | None, float | None, int, bool]


class Refused(Exception):
    """The model refuses the operation; ``reason`` names the broker's answer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Then:
    """A continuation: follow-up ``then:<id>`` in ``queue`` when the task completes, and
    also when it is archived if ``on_archived``."""

    queue: str
    on_archived: bool = False
    max_retry: int = 0
    retention: float = 60.0


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
    #: key -> (concurrency, rate, per, cost, sequence), in the order the task gives them.
    limits: dict[str, Spec] = field(default_factory=dict)
    #: W25: it keeps the slots of its sequences' keys (counted in their ``running``) across
    #: an end that was not final; a claim does not count them again.
    kept: bool = False
    #: W22: the template of its fair limit (the first of ``limits``, its partition), and
    #: the turn the task got when it was stored.
    fair: str | None = None
    turn: int = 0
    unique: str | None = None
    unique_until: float | None = None
    then: Then | None = None
    #: The group this task is a member of, and its place in it.
    group: Group | None = None
    index: int = 0
    retried: int = 0
    lost: int = 0
    token: str | None = None
    lease_until: float | None = None
    #: Completed: when its retention ends. Archived: when it was archived.
    expires_at: float | None = None
    cancel_requested: bool = False
    last_error: str | None = None
    #: The limit key a pending task is held on (out of the claimable set meanwhile).
    held: str | None = None
    #: Let back from ``held`` on this key by a claim that filled up before it reached the
    #: task: a broker may still show it held until a claim looks at it (PostgreSQL lets
    #: held tasks back only as its claim reaches them; what a claim returns is the same).
    lingering: str | None = None
    #: W15: how many unfinished tasks this one still waits for, and the waiting tasks that
    #: wait for this one (forgotten once this one finishes: it counts once).
    waiting_for: int = 0
    dependents: list[tuple[str, str]] = field(default_factory=list)
    #: W19: the names of the signals delivered to it, and the one its last wait asked for.
    signals: set[str] = field(default_factory=set)
    awaits: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.queue, self.id)


@dataclass
class Group:
    """Members created together, and ``group:<id>`` in queue ``then`` waiting beside them,
    released once all finished."""

    id: str
    queue: str
    members: list[tuple[str, str]]
    then: str | None
    #: Per member: ``None`` until its first final outcome, then (state, error or None).
    outcomes: list[tuple[str, str | None] | None]
    finished_at: float | None = None

    @property
    def finished(self) -> int:
        return sum(1 for o in self.outcomes if o is not None)


@dataclass
class Counter:
    """One flow-control key of one queue (W13), as ``durq.brokers.limiter`` states it: the
    running attempts, a token bucket, the last limit a started task carried, whether some
    task may be held on it (cleared when letting tasks back finds none left), the largest
    cost of the tasks held on it since it last had none (W24), and an operator's override
    (W23): its concurrency and its rate, each ``None`` when not set."""

    running: int = 0
    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None
    tokens: float = 0.0
    refilled_at: float = 0.0
    waiting: bool = False
    need: int = 1
    override_concurrency: int | None = None
    override_rate: tuple[int, float] | None = None
    #: A task of the key has started: the key's own limit is known (W23: an override may
    #: make the counter of a key whose tasks a broker has only looked at, each broker
    #: keeping the limit of the one it saw first, or none).
    started: bool = False

    def in_force(
        self, concurrency: int | None, rate: int | None, per: float | None
    ) -> tuple[int | None, int | None, float | None]:
        """W23: a limit as claims apply it: each part the override sets replaces its own."""
        if self.override_concurrency is not None:
            concurrency = self.override_concurrency
        if self.override_rate is not None:
            rate, per = self.override_rate
        return concurrency, rate, per

    def limit(self) -> tuple[int | None, int | None, float | None]:
        """The key's limit in force: the override's parts, else the last task's."""
        return self.in_force(self.concurrency, self.rate, self.per)

    def tokens_at(self, now: float, rate: int | None = None, per: float | None = None) -> float:
        """Up to ``rate`` tokens, refilled at ``rate / per`` a second (the key's rate in
        force unless a task's own is given); unbounded without a rate."""
        if rate is None or per is None:
            _, rate, per = self.limit()
        if rate is None or per is None:
            return math.inf
        return min(float(rate), self.tokens + max(0.0, now - self.refilled_at) * rate / per)

    def room(self, now: float) -> int:
        """How many held tasks may come back: judged by the key's limit in force (the
        override's parts, else the last task's), none until the units its held tasks need
        are free (W24)."""
        concurrency, _, _ = self.limit()
        room = math.inf if concurrency is None else concurrency - self.running
        tokens = self.tokens_at(now)
        if tokens != math.inf:
            room = min(room, math.floor(tokens + 1e-9))
        room = max(0, int(min(room, 10**9)))
        return room if room >= self.needed() else 0

    def needed(self) -> int:
        """The units held tasks wait for, at most what the key's limit in force holds."""
        if not self.waiting:
            return 1
        need = self.need
        for part in self.limit()[:2]:
            if part is not None:
                need = min(need, part)
        return max(1, need)

    def next_room_at(self, now: float) -> float | None:
        """When the tokens its held tasks need come, if only the bucket holds the key back
        (``None``: a running attempt must end first)."""
        need = self.needed()
        concurrency, rate, per = self.limit()
        if concurrency is not None and self.running + need > concurrency:
            return None
        if rate is None or per is None:
            return None
        missing = need - self.tokens_at(now)
        return now if missing <= 0 else now + missing * per / rate


def queue_order(weights: dict[str, int], strict: bool) -> list[str] | None:
    """W8: strict order takes the heaviest queue first, always (ties in the order given).
    Weighted order is random, each queue first with a chance by its weight (``None``: any
    order of the queues; the claim fills in the order the worker drew)."""
    if strict or len(weights) == 1:
        return sorted(weights, key=lambda q: -weights[q])
    return None


@dataclass
class Model:
    now: float
    max_lost: int = 3
    tasks: dict[tuple[str, str], Task] = field(default_factory=dict)
    queues: set[str] = field(default_factory=set)
    #: Queues a group names (members, follow-up): a broker may know them from its enqueue
    #: on, even a refused one (Redis records the queues before its script checks).
    named: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    counters: dict[tuple[str, str], Counter] = field(default_factory=dict)
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    #: W22, by queue and fair template: the last turn given to each partition (its key),
    #: and the turn of the latest task of the template a claim started (its round).
    turns: dict[tuple[str, str, str], int] = field(default_factory=dict)
    rounds: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Follow-ups created since the caller last looked: (queue, id, what it reports).
    created: list[tuple[str, str, dict[str, object]]] = field(default_factory=list)
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

    def free_unique(self, key: tuple[str, str], unique: str, states: tuple[str, ...]) -> bool:
        """E4 (durq.Unique's states): a twin still holding ``unique`` in one of ``states``
        lets it go."""
        task = self.live(key)
        if task is None or task.unique != unique or task.state not in states:
            return False
        task.unique = task.unique_until = None
        return True

    def replace_twin(
        self, key: tuple[str, str], unique: str, delay: float | None, priority: int | None
    ) -> bool:
        """E4 (on_conflict="replace"): a twin holding ``unique`` that has not started takes
        the new content; a scheduled one also the new due time and priority."""
        task = self.live(key)
        if task is None or task.unique != unique or task.state not in (PENDING, SCHEDULED, RETRY):
            return False
        if task.state == SCHEDULED:
            if delay is not None:
                task.due = self.now + delay
            if priority is not None:
                task.priority = priority
        return True

    def observe(self, key: tuple[str, str]) -> tuple[str, int, int, str | None] | None:
        """(state, retried, lost, held on) as a broker reports it; ``None``: no such task."""
        task = self.live(key)
        if task is None:
            return None
        state = task.state
        if state in CLAIMABLE and task.due <= self.now:
            state = "due"
        return (state, task.retried, task.lost, task.held)

    def limit_stats(
        self, queue: str
    ) -> dict[str, tuple[int, float | str | None, int, int, tuple[object, ...]]]:
        """Keys a claim started or held a task on, or an override was set on: (running,
        tokens, held tasks, lingering tasks that a broker may still count held, the
        override's concurrency and rate). Tokens are :data:`UNSEEN` while no task of the
        key has started and no override sets its rate: whether it shows a rate then is
        the broker's."""
        mine = [t for t in self.tasks.values() if t.queue == queue]
        return {
            key: (
                c.running,
                UNSEEN
                if not c.started and c.override_rate is None
                else None
                if c.limit()[1] is None
                else c.tokens_at(self.now),
                sum(1 for t in mine if t.held == key),
                sum(1 for t in mine if t.lingering == key and t.state in CLAIMABLE),
                (c.override_concurrency, c.override_rate),
            )
            for (q, key), c in sorted(self.counters.items())
            if q == queue
        }

    # -- enqueue (E2, E3, E4) and groups ---------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        task_id: str,
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_retry: int = 25,
        retention: float = 0.0,
        limits: dict[str, Spec] | None = None,
        fair: str | None = None,
        unique: str | None = None,
        unique_ttl: float | None = None,
        then: Then | None = None,
        after: tuple[str, ...] = (),
    ) -> Task:
        """Create a task, or raise Refused("conflict") / Refused("duplicate"). ``after``: ids
        in ``queue`` it waits for; those that exist and have not finished count (W15)."""
        self._check(queue, task_id, unique, [])
        until = None if unique is None or unique_ttl is None else self.now + unique_ttl
        holding = [
            d
            for d in (self.live((queue, a)) for a in after)
            if d is not None and d.state not in (COMPLETED, ARCHIVED)
        ]
        task = self._insert(
            Task(
                queue=queue,
                id=task_id,
                state=SCHEDULED if delay > 0 else PENDING,
                priority=priority,
                due=self.now + delay,
                seq=0,
                max_retry=max_retry,
                retention=retention,
                limits=dict(limits or {}),
                fair=fair,
                unique=unique,
                unique_until=until,
                then=then,
            )
        )
        if holding:
            task.state, task.waiting_for = WAITING, len(holding)
            for dependency in holding:
                dependency.dependents.append(task.key)
        return task

    def _check(self, queue: str, task_id: str, unique: str | None, before: list[Task]) -> None:
        """E3 first, then E4; ``before``: tasks of the same step not stored yet."""
        if self.live((queue, task_id)) is not None:
            raise Refused("conflict")
        if unique is None:
            return
        if self._unique_holder(queue, unique) is not None or any(
            t.queue == queue and t.unique == unique for t in before
        ):
            raise Refused("duplicate")

    def _insert(self, task: Task) -> Task:
        if task.unique is not None:
            # E4: a task whose ttl passed loses its key to the new one (no longer its twin).
            for other in self.tasks.values():
                if other.queue == task.queue and other.unique == task.unique:
                    other.unique = other.unique_until = None
        task.seq = next(self._seq)
        if task.fair is not None:
            # W22: one turn after the partition's last, and never before the template's
            # round, so a partition new to the line waits one turn at most; turns given only
            # go up (a task gone does not give its turn back).
            partition = (task.queue, task.fair, next(iter(task.limits)))
            task.turn = max(self.turns.get(partition, 0), self.rounds.get(partition[:2], 0)) + 1
            self.turns[partition] = task.turn
        self.tasks[task.key] = task
        self.queues.add(task.queue)
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

    def enqueue_graph(self, nodes: list[tuple[Task, tuple[int, ...]]]) -> list[Task]:
        """A workflow: every task or none. One that names an id or a unique key twice is
        refused first (the first such task in order, id before key); then the first task
        whose id is taken or unique key held. A task waits for the earlier tasks it names
        by index: they were just created, so none has finished. ``nodes`` are built like
        :meth:`enqueue`'s tasks, due times relative to now."""
        tasks = [t for t, _ in nodes]
        self.named.update(t.queue for t in tasks)
        for i, t in enumerate(tasks):
            if any(e.key == t.key for e in tasks[:i]):
                raise Refused("conflict")
            if t.unique is not None and any(e.unique == t.unique for e in tasks[:i]):
                raise Refused("duplicate")
        for t in tasks:
            self._check(t.queue, t.id, t.unique, [])
        for t, edges in nodes:
            t.due += self.now
            if t.unique is not None and t.unique_until is not None:
                t.unique_until += self.now
            self._insert(t)
            if edges:
                t.state, t.waiting_for = WAITING, len(edges)
                for j in edges:
                    tasks[j].dependents.append(t.key)
        return tasks

    def enqueue_group(self, group_id: str, members: list[Task], then: str | None) -> Group:
        """All members or none: the first refused member (in order) refuses the group.
        ``members`` are built like :meth:`enqueue`'s tasks, due times relative to now."""
        self.named.update(m.queue for m in members)
        if then is not None:
            self.named.add(then)
        for i, member in enumerate(members):
            self._check(member.queue, member.id, member.unique, members[:i])
        if then is not None and self.live((then, f"group:{group_id}")) is not None:
            raise Refused("conflict")
        group = Group(
            id=group_id,
            queue=members[0].queue,
            members=[m.key for m in members],
            then=then,
            outcomes=[None] * len(members),
        )
        for i, member in enumerate(members):
            member.group, member.index = group, i
            member.due += self.now
            if member.unique is not None and member.unique_until is not None:
                member.unique_until += self.now
            self._insert(member)
        if then is not None:
            # The follow-up exists from the start, waiting for one thing: its group.
            follow_up = self._insert(
                Task(
                    queue=then,
                    id=f"group:{group_id}",
                    state=WAITING,
                    priority=0,
                    due=self.now,
                    seq=0,
                    max_retry=0,
                    retention=60.0,
                )
            )
            follow_up.waiting_for = 1
        self.groups[(group.queue, group_id)] = group
        return group

    # -- claim (W1, W8, W13, I4) --------------------------------------------------------------

    def promote(self) -> None:
        """E2: due scheduled and retry tasks become pending (a claim forwards them first;
        before that the inspector still sees, and may run, a due scheduled task); so do
        waits for a signal whose time ran out (W19: only the promoter ends those)."""
        for task in self.tasks.values():
            if task.state in (SCHEDULED, RETRY) and task.due <= self.now:
                task.state = PENDING
            elif task.state == WAITING and task.awaits is not None and task.due <= self.now:
                task.state = PENDING

    def claim_order(self, queue: str) -> list[Task]:
        """Claimable tasks of ``queue`` (due, waiting, not held): higher priority, then due
        time, then enqueue order."""
        due = [
            t
            for t in self.tasks.values()
            if t.queue == queue and t.state in CLAIMABLE and t.due <= self.now and t.held is None
        ]
        return sorted(due, key=lambda t: (-t.priority, t.due, t.seq))

    def claim(self, queues: list[str], limit: int, lease: float) -> list[Task]:
        """Up to ``limit`` tasks, filling from ``queues`` in the order given. Per queue: held
        tasks whose key has room come back first; then each claimable task in order is
        started, or held on its first key without room (never blocking those behind it).

        W22: when the next task in order carries a fair limit, the claim takes instead the
        task of the same template whose turn comes first (same priority, then the lowest
        turn, then enqueue order): the template keeps its place in the queue (that of its
        first task in order) and its partitions take turns in it."""
        self.promote()
        taken: list[Task] = []
        for queue in queues:
            if len(taken) == limit:
                break
            if queue in self.paused:
                continue
            self._let_back(queue)
            while len(taken) < limit:
                order = self.claim_order(queue)
                if not order:
                    break
                task = order[0]
                if task.fair is not None:
                    task = min(
                        (t for t in order if t.fair == task.fair),
                        key=lambda t: (-t.priority, t.turn, t.seq),
                    )
                task.lingering = None
                full = self._blocking(task)
                if full is not None:
                    task.held = full
                    counter = self.counters[(queue, full)]
                    cost = task.limits[full][3]
                    counter.need = max(counter.need, cost) if counter.waiting else cost
                    counter.waiting = True
                    continue
                for key, spec in task.limits.items():
                    self._take(queue, key, spec, task.kept)
                if task.fair is not None:
                    fair = (queue, task.fair)
                    self.rounds[fair] = max(self.rounds.get(fair, 0), task.turn)
                task.state = ACTIVE
                task.token = f"t{next(self._tokens)}"
                task.lease_until = self.now + lease
                task.cancel_requested = False
                taken.append(task)
        return taken

    def _blocking(self, task: Task) -> str | None:
        """W13: the first key of the task without room by the task's own limit (W23: each
        part the key's override sets instead; a sequence's one at a time may be paused by
        it, not widened): ``cost`` free slots (W24) and as many tokens in the key's
        bucket."""
        for key, (own, rate, per, cost, sequence) in task.limits.items():
            counter = self.counters.get((task.queue, key))
            if counter is None:
                continue  # a key no claim started: nothing runs, the bucket is full
            concurrency, rate, per = counter.in_force(own, rate, per)
            if sequence and own is not None and concurrency is not None:
                concurrency = min(concurrency, own)
            holds = task.kept and sequence  # W25: its slot is counted already
            if concurrency is not None and not holds and counter.running + cost > concurrency:
                return key
            if rate is not None and counter.tokens_at(self.now, rate, per) < cost - 1e-9:
                return key
        return None

    def _take(self, queue: str, key: str, spec: Spec, kept: bool) -> None:
        """Count one start: ``cost`` running units, and as many tokens at the rate in
        force; the key keeps the task's own limit (what a reset of an override goes back
        to). A sequence's slot the task kept is counted already (W25)."""
        concurrency, rate, per, cost, sequence = spec
        counter = self.counters.get((queue, key))
        if counter is None:  # a bucket full at whatever rate applies first
            counter = self.counters[(queue, key)] = Counter(refilled_at=-math.inf)
        _, rate_now, per_now = counter.in_force(concurrency, rate, per)
        if rate_now is not None and per_now is not None:
            counter.tokens = counter.tokens_at(self.now, rate_now, per_now) - cost
            counter.refilled_at = self.now
        counter.concurrency, counter.rate, counter.per = concurrency, rate, per
        if rate is None or per is None:
            counter.rate = counter.per = None
        if not (kept and sequence):
            counter.running += cost
        counter.started = True

    def _let_back(self, queue: str) -> None:
        """Held tasks of a key with room rejoin the claimable set, in claim order, as many
        as the key's room (by its last limit)."""
        for (q, key), counter in sorted(self.counters.items()):
            if q != queue or not counter.waiting:
                continue
            held = sorted(
                (t for t in self.tasks.values() if t.queue == queue and t.held == key),
                key=lambda t: (-t.priority, t.due, t.seq),
            )
            room = counter.room(self.now)
            for task in held[:room]:
                task.held, task.lingering = None, key
            if room >= len(held):
                counter.waiting = False

    def wake_at(self, queues: list[str]) -> float | None:
        """When a token comes for a key a task is held on (the latest a claim that came
        back short may tell its worker to look again)."""
        times = [
            at
            for (queue, key), c in self.counters.items()
            if queue in queues
            and queue not in self.paused
            and any(t.queue == queue and t.held == key for t in self.tasks.values())
            and (at := c.next_room_at(self.now)) is not None
        ]
        return min(times, default=None)

    def _release(self, task: Task, keep: bool = False) -> None:
        """Every end of an attempt gives back its running units on each of its keys; one
        that is not final (``keep``) keeps its sequences' keys (W25)."""
        for key, spec in task.limits.items():
            counter = self.counters.get((task.queue, key))
            if counter is not None and not (keep and spec[4]):
                counter.running = max(0, counter.running - spec[3])
        task.kept = keep and any(spec[4] for spec in task.limits.values())

    def _give_back_kept(self, task: Task) -> None:
        """W25: a task that kept its sequences' keys is archived, cancelled or deleted
        without running: their slots come back."""
        if task.kept:
            for key, spec in task.limits.items():
                counter = self.counters.get((task.queue, key))
                if counter is not None and spec[4]:
                    counter.running = max(0, counter.running - spec[3])
            task.kept = False

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
        self._release(task)
        if task.retention <= 0:
            del self.tasks[key]
            task.state = COMPLETED
        else:
            self._end(task, COMPLETED)
            task.expires_at = self.now + task.retention
        self._finished(task, COMPLETED, None)
        return True

    def fail(self, key: tuple[str, str], token: str, delay: float, error: str) -> bool:
        """Retry after ``delay``, or archived once the retries are used up."""
        task = self._held(key, token)
        if task is None:
            return False
        task.last_error = error
        task.retried += 1
        self._release(task, keep=task.retried <= task.max_retry)
        if task.retried > task.max_retry:
            self._archive(task, error)
        else:
            self._end(task, RETRY)
            task.due = self.now + delay
            task.awaits = None
        return True

    def give_up(self, key: tuple[str, str], token: str, error: str, count_attempt: bool) -> bool:
        """Archived at once (SkipRetry; a cancelled handler does not count its attempt)."""
        task = self._held(key, token)
        if task is None:
            return False
        self._release(task)
        task.last_error = error
        task.retried += 1 if count_attempt else 0
        self._archive(task, error)
        return True

    def wait(self, key: tuple[str, str], token: str, delay: float, name: str) -> bool:
        """A wait for the signal ``name`` (W19, a snooze a signal ends early): waiting until
        the signal comes or ``delay`` passes, or pending now when that signal was delivered
        already."""
        task = self._held(key, token)
        if task is None:
            return False
        self._release(task, keep=True)
        came = name in task.signals
        self._end(task, PENDING if came else WAITING)
        task.due = self.now if came else self.now + delay
        task.awaits = name
        return True

    def signal(self, key: tuple[str, str], name: str) -> str:
        """W19: stored once; a task waiting for this name is due now."""
        task = self.live(key)
        if task is None:
            raise Refused("not found")
        if name in task.signals:
            return "duplicate"
        if task.state in (COMPLETED, ARCHIVED):
            return "finished"
        task.signals.add(name)
        if task.state == WAITING and task.awaits == name:
            task.state, task.due = PENDING, self.now
            return "woken"
        return "kept"

    def requeue(self, key: tuple[str, str], token: str) -> bool:
        """Handed back at shutdown: pending now, the attempt not counted."""
        task = self._held(key, token)
        if task is None:
            return False
        self._release(task, keep=True)
        self._end(task, PENDING)
        task.due = self.now
        return True

    def _end(self, task: Task, state: str) -> None:
        task.state = state
        task.token = None
        task.lease_until = None
        task.cancel_requested = False
        task.held = task.lingering = None
        if state in (COMPLETED, ARCHIVED):
            task.unique = None  # E4: a finished task frees its key

    def _archive(self, task: Task, error: str) -> None:
        self._give_back_kept(task)  # W25: the inspector's archive or cancel of a waiting task
        self._end(task, ARCHIVED)
        task.expires_at = self.now  # archived retention counts from here
        self._finished(task, ARCHIVED, error)

    # -- what a final outcome creates: continuations and group fan-in --------------------------

    def _finished(self, task: Task, state: str, error: str | None) -> None:
        """A task completed or was archived (``state``), or deleted unfinished: its
        continuation, and its group's outcome (only a member's first final one counts); the
        move that counts a group's last member creates the group's follow-up, once; each task
        waiting for it counts it, and the last one it waited for releases it (W15)."""
        for key in task.dependents:
            waiting = self.tasks.get(key)
            if waiting is None or waiting.state != WAITING:
                continue  # cancelled, archived or deleted meanwhile
            waiting.waiting_for -= 1
            if waiting.waiting_for == 0:
                waiting.state = PENDING if waiting.due <= self.now else SCHEDULED
        task.dependents = []
        then = task.then
        if then is not None and (state == COMPLETED or (state == ARCHIVED and then.on_archived)):
            self._follow_up(
                then.queue,
                f"then:{task.id}",
                {"of": task.id, "state": state, "error": error},
                then.max_retry,
                then.retention,
            )
        group = task.group
        if group is None or group.outcomes[task.index] is not None:
            return
        group.outcomes[task.index] = (state, error)
        if group.finished < len(group.outcomes):
            return
        group.finished_at = self.now
        if group.then is not None:
            members = [
                (queue, task_id, outcome[0], outcome[1])
                for (queue, task_id), outcome in zip(group.members, group.outcomes, strict=True)
                if outcome is not None
            ]
            follow_up = self.tasks.get((group.then, f"group:{group.id}"))
            if follow_up is None or follow_up.state != WAITING:
                return  # cancelled or deleted while it waited: it never runs
            follow_up.waiting_for = 0
            follow_up.state = PENDING if follow_up.due <= self.now else SCHEDULED
            self.created.append((group.then, follow_up.id, {"members": members}))

    def _follow_up(
        self, queue: str, task_id: str, report: dict[str, object], max_retry: int, retention: float
    ) -> None:
        """Created in the same atomic step; skipped when its id is taken."""
        if self.live((queue, task_id)) is not None:
            return
        self._insert(
            Task(
                queue=queue,
                id=task_id,
                state=PENDING,
                priority=0,
                due=self.now,
                seq=0,
                max_retry=max_retry,
                retention=retention,
            )
        )
        self.created.append((queue, task_id, report))

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
        for task in sorted(self.tasks.values(), key=lambda t: t.key):  # as lifecycle orders them
            if task.state != ACTIVE or task.lease_until is None or task.lease_until > self.now:
                continue
            task.retried += 1
            task.lost += 1
            final = task.lost >= self.max_lost or task.retried > task.max_retry
            self._release(task, keep=not final)  # W25: a rescued task runs again first
            if task.lost >= self.max_lost:
                task.last_error = WORKER_LOST
                self._archive(task, WORKER_LOST)
            elif task.retried > task.max_retry:
                task.last_error = LEASE_EXPIRED
                self._archive(task, LEASE_EXPIRED)
            else:
                self._end(task, RETRY)
                task.due = self.now
                task.awaits = None
                task.last_error = LEASE_EXPIRED
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
        """A waiting task archived, with its last error (or "archived") as its outcome."""
        task = self._found(key)
        if task.state not in (*CLAIMABLE, WAITING):
            raise Refused("invalid state")
        self._archive(task, task.last_error or "archived")

    def delete(self, key: tuple[str, str]) -> None:
        """Any task but an active one; a group member that had not finished counts as
        finished ``deleted``."""
        task = self._found(key)
        if task.state == ACTIVE:
            raise Refused("invalid state")
        self._give_back_kept(task)
        del self.tasks[key]
        if task.state in (*CLAIMABLE, WAITING):
            self._finished(task, DELETED, None)

    def cancel(self, key: tuple[str, str]) -> None:
        """Waiting: archived "cancelled" at once. Active: flagged for its worker."""
        task = self._found(key)
        if task.state in (*CLAIMABLE, WAITING):
            task.last_error = CANCELLED
            self._archive(task, CANCELLED)
        elif task.state == ACTIVE:
            task.cancel_requested = True
        else:
            raise Refused("invalid state")

    def set_limit(
        self,
        queue: str,
        key: str,
        concurrency: int | None,
        rate: tuple[int, float] | None,
        known: bool = False,
    ) -> None:
        """W23: an operator's limit for one key of a known queue, winning over every task's
        own until reset (a part left ``None`` keeps the tasks'). A key no claim counted
        gets a counter: nothing running, a bucket full at whatever rate applies first. A
        queue only a group named is known if the broker says so (``known``), as for
        :meth:`pause`."""
        if known and queue in self.named:
            self.queues.add(queue)
        if queue not in self.queues:
            raise Refused("no queue")
        counter = self.counters.get((queue, key))
        if counter is None:
            counter = self.counters[(queue, key)] = Counter(refilled_at=-math.inf)
        counter.override_concurrency, counter.override_rate = concurrency, rate

    def reset_limit(self, queue: str, key: str) -> bool:
        """W23: the tasks' own limit applies again; whether an override was set."""
        counter = self.counters.get((queue, key))
        if counter is None or (
            counter.override_concurrency is None and counter.override_rate is None
        ):
            return False
        counter.override_concurrency = counter.override_rate = None
        return True

    def pause(self, queue: str, paused: bool, known: bool = False) -> None:
        """I4: a paused queue hands out nothing and still takes enqueues. A queue exists
        once a task was enqueued in it; one that only a group named exists if the broker
        says so (``known``)."""
        if known and queue in self.named:
            self.queues.add(queue)
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

    # -- time and the janitor (E5) --------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def janitor(self) -> None:
        """Completed tasks past their retention are deleted (already gone to readers)."""
        for key in [k for k in self.tasks if self.live(k) is None]:
            del self.tasks[key]

    def delete_archived(self, keep: dict[str, float | None]) -> None:
        """Archived tasks archived ``keep[queue]`` seconds ago or more are deleted (``None``
        keeps them); their groups do not change (the outcome was counted when archived)."""
        for key, task in list(self.tasks.items()):
            seconds = keep.get(task.queue)
            if task.state != ARCHIVED or seconds is None or task.expires_at is None:
                continue
            if task.expires_at <= self.now - seconds:
                del self.tasks[key]
