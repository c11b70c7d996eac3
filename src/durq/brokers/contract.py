"""The contract every broker honours, and its two seams: :class:`Broker` (the hot path) and :class:`Admin`
(the inspector). The CLI, the dashboard and the worker go through these and nothing else.

Times are epoch seconds (``float``) on the broker's clock. Relative times (``process_in``, a
retry's delay, ``unique_ttl``, ``retention``, lease lengths) cross this seam as seconds and
become moments inside the statement or script that stores them: PostgreSQL's and Redis's own
clock, the machine's for SQLite and memory; a test's injected :class:`~durq.clock.Clock` wins.
:class:`~durq.task.TaskInfo` turns them into aware datetimes for users.

Contract notes that every backend honours (the conformance suite checks each):

* A task is claimable when its state is pending, or scheduled/retry with
  ``next_process_at <= now``; a backend may take due scheduled/retry rows directly in
  ``claim`` or forward them in ``promote_due``. Claim order within a queue: ``priority``
  (higher first), then ``next_process_at``, then enqueue order. A task keeps its priority
  through retries, rescues and requeues. Paused queues give nothing.
* Every move of an active task out of it (complete, retry, archive, requeue, and the
  rescuer's ``move_leases``) gives back the running slot of each of its limit keys, in the
  same atomic step, and wakes the queue's workers when tasks are held on such a key.
* Every mutation of an active task names its :class:`LeaseRef`; the backend changes the task
  only if it is still active *with that token* (fencing) and answers ``False`` otherwise.
* A completed task whose retention has passed counts as gone for ``task_id`` conflicts even
  before the janitor deletes it.
* Brokers store; they do not decide. Which state a task goes to next, and which follow-up
  tasks that creates, is decided above this seam by :mod:`durq.lifecycle` (with
  :mod:`durq.states` as the only table of moves); a broker performs the move it is handed,
  fenced, and answers whether the fence held.
* Counters for the inspector (I1): ``complete`` adds one processed; ``retry`` and ``archive``
  (when it counts an attempt) add one processed and one failed, per queue and per UTC day of
  the broker clock (also through ``move_leases``), and per minute of the broker clock, kept
  :data:`MINUTE_COUNTS_KEEP` seconds (the janitor's ``delete_expired`` drops older ones).
* Follow-ups (``follow_ups`` of the params) are created in the same atomic step as the move
  (one transaction, one script), and never when the fence fails; a follow-up whose task id
  (or unique key) exists is skipped without failing the move.
* Groups (:class:`GroupParams`): the members are created all or none. A move that carries
  a :class:`MemberOutcome` (complete, archive, the inspector's archive) records the member's
  first final outcome and counts it finished in the same atomic step; deleting a member that
  has not finished records its ``unfinished`` entry with state ``deleted``. The step that
  counts the last member creates the group's follow-up (payload: ``then.payload``, the
  members' entries in group order joined by ``,``, then ``tail``), exactly once.
* ``list_workers`` shows workers whose last heartbeat is younger than 60 s.
* Backend failures to reach the server raise :class:`~durq.errors.BrokerUnavailableError`
  with ``operation`` set (``"sqlite.claim"``), never a driver exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

from durq.brokers.params import (
    ArchivedRetention,
    ArchiveParams,
    Claimed,
    ClaimParams,
    CompleteParams,
    EnqueueOutcome,
    EnqueueParams,
    GroupParams,
    Lease,
    LeaseMove,
    LeaseRef,
    LeaseReport,
    LimitOverride,
    ProgressParams,
    RetryParams,
    SignalParams,
    StepsParams,
    TaskMove,
    TaskRewrite,
    TwinReplace,
    UniqueRelease,
    WorkflowParams,
)
from durq.brokers.views import (
    FairDepth,
    GroupInfo,
    LimitStats,
    MinuteCounts,
    QueueStats,
    ScheduleRecord,
    TaskOutcome,
    TaskSearch,
    TaskSearchResult,
    UniqueHolds,
    WorkerInfo,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
)
from durq.clock import Clock
from durq.states import TaskState
from durq.task import TaskInfo

# Capability names a backend may declare; conformance tests that need one skip by name.
#: ``enqueue(..., connection=)`` joins the caller's open transaction.
CAP_TRANSACTIONAL_ENQUEUE = "transactional_enqueue"


#: The broker is a :class:`SyncConnectionEnqueue`: it enqueues inside a caller's *sync*
#: connection, on the calling thread (``app.enqueue_sync(..., connection=)``).
CAP_SYNC_CONNECTION_ENQUEUE = "sync_connection_enqueue"


CAP_CROSS_PROCESS_NOTIFY = "cross_process_notify"


#: Follow-ups (``CompleteParams.follow_ups``, ``ArchiveParams.follow_ups``) are written
#: atomically with the outcome by every broker (the contract above); this one says: also
#: when a follow-up goes to another queue than its task. The SQL brokers and a
#: single Redis node write it atomically; a Redis Cluster writes it to the completing queue's
#: outbox atomically and creates it in the other queue's slot right after.
CAP_CROSS_QUEUE_FOLLOW_UPS = "cross_queue_follow_ups"


#: A group's members and its follow-up may be in several queues, still counted and created
#: in one atomic step. All but a Redis Cluster (one script stays in one hash slot there).
CAP_CROSS_QUEUE_GROUPS = "cross_queue_groups"


#: Brokers in other processes (workers, the CLI) see the same tasks. All but ``memory://``.
CAP_MULTI_PROCESS = "multi_process"


#: The broker is a :class:`CompleteAndClaim`: a worker's completions ride in its next claim,
#: one round trip for both. Without it (``memory://``, which has no round trip to save) the
#: worker sends ``complete_many``, then ``claim``; it does so too for completions the two
#: below do not cover. With it alone, only completions without follow-ups or a group
#: outcome, of the claim's first queue, ride.
CAP_COMPLETE_AND_CLAIM = "complete_and_claim"


#: ... also completions with follow-ups or a group member's outcome (SQLite, Redis; on
#: PostgreSQL those complete in a transaction of their own).
CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS = "complete_and_claim_follow_ups"


#: ... also completions of other queues than the claim's first one, still stored before the
#: claim runs. All but a Redis Cluster (another queue may live on another node, written at
#: the same time as the claim, not surely before it).
CAP_COMPLETE_AND_CLAIM_ANY_QUEUE = "complete_and_claim_any_queue"


#: The broker is a :class:`WaitAndClaim`: an idle worker's wait for work and its next claim
#: go to the broker together, which runs the claim as soon as work arrives (Redis on a single
#: node): a pickup one round trip shorter.
CAP_WAIT_AND_CLAIM = "wait_and_claim"


#: ``EnqueueParams.after``: a task waits for others and is released in the same atomic step
#: as the outcome of the last of them (see :mod:`durq.brokers.dependencies`).
CAP_DEPENDENCIES = "dependencies"


class EndWatch(Protocol):
    """A subscription to the end of one task (see :meth:`Broker.watch_end`)."""

    async def wait(self, timeout: float) -> bool:
        """Wait until the task may have ended (completed, archived or deleted), or
        ``timeout`` s. ``True`` when notified; a notification that came before this call
        (since the subscription began) returns at once. Spurious wake-ups are allowed."""


@runtime_checkable
class Broker(Protocol):
    """The hot path: what clients and workers call. All methods are coroutine functions."""

    #: Short name used in errors and metrics: ``"sqlite"``, ``"postgres"``, ``"redis"``.
    name: str
    #: Capability names (see ``CAP_*``) this backend provides.
    capabilities: frozenset[str]

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with (the server's, once measured)."""

    async def connect(self) -> None:
        """Open connections (idempotent). Raises BrokerUnavailableError or SchemaError."""

    async def close(self) -> None:
        """Release every connection (idempotent)."""

    async def migrate(self) -> list[str]:
        """Bring the storage to the current schema; returns the migrations applied."""

    async def pending_migrations(self) -> list[str]:
        """The migrations :meth:`migrate` would apply now, by the names it reports; writes
        nothing (a missing SQLite file stays missing). SchemaError for a schema newer than
        this code."""

    async def ping(self) -> None:
        """One cheap round trip; raises BrokerUnavailableError."""

    async def enqueue(self, params: EnqueueParams, *, connection: Any = None) -> TaskInfo:
        """Create one task, atomically checking task id (E3) and uniqueness (E4).

        ``connection``: on SQL brokers, the caller's open connection; the task is written in
        its transaction and exists only if the caller commits (E8)."""

    async def enqueue_many(
        self, items: Sequence[EnqueueParams], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """Create many tasks in one round trip where the backend can; one outcome per item."""

    async def enqueue_group(self, params: GroupParams) -> list[TaskInfo]:
        """Create a group's record, all its members and its follow-up (waiting for the
        group: :func:`~durq.brokers.params.waiting_follow_up`) atomically, or nothing: the
        first refused task raises its TaskIDConflictError/DuplicateTaskError. Returns the
        members' infos."""

    async def enqueue_graph(
        self, items: Sequence[EnqueueParams], workflow: WorkflowParams | None = None
    ) -> list[TaskInfo]:
        """Create every task of ``items`` atomically, or nothing (a workflow): the first
        refused item raises its TaskIDConflictError/DuplicateTaskError; a call that names
        one id or unique key twice is refused before the storage is asked
        (:func:`~durq.brokers.params.check_distinct`). An item's ``after`` names
        earlier items of the call only (:func:`~durq.brokers.dependencies.graph_edges`):
        it is stored ``waiting`` for as many and each of them lists it as a dependent, so
        the countdown of :mod:`~durq.brokers.dependencies` releases it. ``workflow``: its
        record, written in the same transaction or script (on Redis in the slot of its
        first node's queue), stamped with the broker's clock to the microsecond. Returns
        the infos in order."""

    async def claim(self, params: ClaimParams) -> list[Lease]:
        """Lease up to ``params.limit`` claimable tasks (state active, new fencing token,
        ``lease_expires_at = now + lease_seconds``). Never hands one task to two callers.
        Each lease's task carries its recorded durable steps (``TaskInfo.steps``, as stored
        when the lease was taken): its attempt starts from them without ``read_steps``.

        Flow control, atomically with the lease: a task is taken only if each of its
        ``limits`` has room (running < concurrency, a token in the bucket), and counts one
        running and one token on each; a task without room is held (stays pending, out of
        the claimable set) and the claim goes on with the next task. Held tasks come back
        in a later claim once their key has room. May return :class:`Claimed` to say when
        a token comes for a held task."""

    async def extend_leases(self, leases: Sequence[LeaseRef], lease_seconds: float) -> LeaseReport:
        """Heartbeat: push the expiry of every held lease; report lost ones and cancel asks."""

    async def complete(self, params: CompleteParams) -> bool:
        """Finish a task; ``False`` (and no change) if the lease is no longer held."""

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        """``complete`` for several tasks in one round trip."""

    async def report_progress(self, params: ProgressParams) -> bool:
        """Store a running attempt's progress and log lines on its task, fenced like every
        other write of an active task: ``False`` (and no change) if the lease is no longer
        held. Keeps the last :data:`durq.progress.MAX_LOG_LINES` lines."""

    async def read_steps(self, lease: LeaseRef) -> str | None:
        """The stored durable steps of a leased task (:mod:`durq.steps`), ``None`` for none;
        read when a snooze is counted (an attempt starts from the steps its claim returned)."""

    async def record_steps(self, params: StepsParams) -> bool:
        """Store a running attempt's durable steps, fenced like every other write of an
        active task: ``False`` (and no change) if the lease is no longer held."""

    async def record_steps_many(self, items: Sequence[StepsParams]) -> list[bool]:
        """``record_steps`` for several attempts in one round trip (one statement on
        PostgreSQL, one write transaction on SQLite, one pipeline on Redis): one answer per
        item, in order, each fenced on its own. Items of one lease are written in order (the
        last one's steps stay)."""

    async def read_signals(self, lease: LeaseRef) -> str | None:
        """The signals stored on a leased task, as the text of one JSON object (name ->
        payload, each payload exactly as it was sent); ``None`` for none, or when the lease
        is no longer held."""

    async def signal(self, params: SignalParams) -> str:
        """Deliver a signal, in one atomic step: TaskNotFoundError when the task does not
        exist; "duplicate" (nothing changed) when a signal of that name is stored already,
        whatever the task's state; "finished" (nothing stored) when it is completed or
        archived; otherwise the
        signal is stored, and a task ``waiting`` for that name (its last move's
        ``RetryParams.awaits``) becomes pending now, its workers woken: "woken"; else
        "kept" (the task reads it when it waits)."""

    async def read_snoozes(self, lease: LeaseRef) -> int | None:
        """How often a leased task was snoozed; ``None`` if the lease is no longer held."""

    async def free_unique(self, params: UniqueRelease) -> bool:
        """Free the unique key a task holds, in one atomic step, only while the task still
        holds ``params.key`` and is in one of ``params.states`` (a twin in a state its
        :class:`durq.Unique` does not block in): ``True`` when freed."""

    async def replace_twin(self, params: TwinReplace) -> TaskInfo | None:
        """Change a waiting twin in place, in one atomic step (see :class:`TwinReplace`):
        the task as changed, or ``None`` when it no longer holds ``params.key`` or is not
        pending, scheduled or retry (a running task is never changed)."""

    async def retry(self, params: RetryParams) -> bool:
        """Schedule the next attempt; ``False`` if the lease is no longer held."""

    async def archive(self, params: ArchiveParams) -> bool:
        """Give up on the task; ``False`` if the lease is no longer held."""

    async def requeue(self, lease: LeaseRef, keep: bool = False) -> bool:
        """Hand an active task back as pending without counting an attempt (shutdown, W7);
        ``keep`` as :attr:`RetryParams.keep` (W25)."""

    async def promote_due(self) -> int:
        """Move scheduled/retry tasks whose time has come to pending; returns how many."""

    async def expired_leases(self, limit: int) -> list[Lease]:
        """Up to ``limit`` active tasks whose lease expired by now, oldest expiry first, with
        their tokens (the rescuer decides what becomes of them, W1)."""

    async def move_leases(self, moves: Sequence[LeaseMove]) -> list[bool]:
        """Apply several fenced ``retry``/``archive`` moves (with their follow-ups) at once:
        one transaction on SQL brokers; on Redis one script per move, each atomic with its
        follow-ups. One answer per move: whether its fence held."""

    async def delete_archived(self, retention: ArchivedRetention, limit: int) -> int:
        """Janitor: delete up to ``limit`` archived tasks archived longer ago than their
        queue's ``retention``; how many. Their group records and follow-ups are unchanged
        (a member's outcome was recorded when it was archived)."""

    async def delete_expired(self, limit: int) -> int:
        """Janitor: delete up to ``limit`` completed tasks whose retention has passed (and
        per-minute counters older than :data:`MINUTE_COUNTS_KEEP`, not counted), then up
        to ``limit`` workflow records past their retention none of whose nodes' tasks is
        left (not counted)."""

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait until a task may be claimable in ``queues`` or ``timeout`` passes.

        Returns ``True`` when woken by a notification. Spurious wake-ups are allowed.
        Level-triggered: an enqueue into ``queues`` that committed after this instance's
        previous ``claim`` started makes it return at once, so nothing slips between a claim
        that came back short and the wait that follows it."""

    def watch_end(self, queue: str, task_id: str) -> AbstractAsyncContextManager[EndWatch]:
        """Subscribe to the end of one task for the duration of the ``async with`` block.

        Entering returns once the subscription holds, so a task read inside the block that
        ends afterwards is always notified: ``complete``, ``archive`` (also through
        ``move_leases``) and the inspector's archive and delete notify, after their commit,
        through the broker's wake-up channel (other processes included where the broker
        has ``multi_process``). When the channel may have lost notifications (a reconnect)
        every watch is woken."""

    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert or refresh a worker's row (its heartbeat); also makes its queues known and
        forgets workers silent for :data:`FORGET_WORKERS_AFTER`."""

    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's row at shutdown."""

    async def durability_warnings(self) -> list[str]:
        """Server settings under which acknowledged tasks can be lost (the worker logs them
        once at start); empty when there are none or the broker cannot tell."""


@runtime_checkable
class WaitAndClaim(Protocol):
    """What a broker declaring :data:`CAP_WAIT_AND_CLAIM` also offers."""

    async def wait_and_claim(self, claim: ClaimParams, timeout: float) -> Claimed | None:
        """Wait up to ``timeout`` seconds for work in ``claim.queues`` and claim it in the
        same step, as :meth:`Broker.claim` would: the leases (none when the time ran out
        with nothing to claim). ``None`` when it does not serve these queues: nothing was
        waited for or claimed, and the caller waits and claims the usual way.

        Cancelling it (the worker stops) ends the wait at once and never loses a lease: a
        claim already under way completes, and what it leased goes back to pending without
        counting an attempt."""
        ...


@runtime_checkable
class CompleteAndClaim(Protocol):
    """What a broker declaring :data:`CAP_COMPLETE_AND_CLAIM` also offers."""

    async def complete_and_claim(
        self, items: Sequence[CompleteParams], claim: ClaimParams
    ) -> tuple[list[bool], list[Lease]]:
        """``complete_many(items)`` then ``claim(claim)`` in one round trip (one transaction on
        SQLite, one pipeline on PostgreSQL and Redis): a busy worker acknowledges the tasks
        it finished and takes the next ones at once.

        The completions are stored before the claim runs, so the claim may fill the slots
        they free and a crash at any moment leaves the worker with no more unacknowledged
        leases than slots. Answers as the two calls would; on an error, as with
        ``complete_many``, some completions may have been stored.

        Called only with at least one completion, a claim of at least one task in at least
        one queue, and completions the broker's capabilities say ride in a claim
        (:data:`CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS`, :data:`CAP_COMPLETE_AND_CLAIM_ANY_QUEUE`):
        the worker decides (``durq.worker.fetcher.rides_in_claim``) and sends the others
        as ``complete_many``, then ``claim``."""


@runtime_checkable
class SyncConnectionEnqueue(Protocol):
    """What a broker declaring :data:`CAP_SYNC_CONNECTION_ENQUEUE` also offers."""

    def enqueue_sync_in(self, params: EnqueueParams, connection: Any) -> TaskInfo:
        """Create one task inside the caller's open sync transaction; no commit."""

    def enqueue_many_sync_in(
        self, items: Sequence[EnqueueParams], connection: Any
    ) -> list[EnqueueOutcome]:
        """``enqueue_many`` inside the caller's open sync transaction; no commit."""


@runtime_checkable
class Admin(Protocol):
    """The inspector's seam (I1-I5). The CLI and the dashboard use only this."""

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue (enqueued into, served by a worker, or paused)."""

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state, oldest first; QueueNotFoundError if unknown."""

    async def search_tasks(self, search: TaskSearch) -> TaskSearchResult:
        """Tasks of one queue and state that pass a filter, with the total that match;
        QueueNotFoundError if the queue is unknown. The SQL brokers filter in the database;
        Redis reads the state's tasks in order up to a bound and says so."""

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """Processed and failed per minute from the minute of ``since`` on, oldest first, of
        one queue or (``None``) summed over all; minutes with nothing, and minutes older
        than :data:`MINUTE_COUNTS_KEEP` (see :func:`first_counted_minute`), are left out.
        What every dashboard draws its throughput chart from."""

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""

    async def get_tasks(self, queue: str, task_ids: Sequence[str]) -> list[TaskInfo | None]:
        """The tasks of ``task_ids`` in one queue, in that order, read in one round trip (a
        workflow node's dependencies); ``None`` for one :meth:`get_task` would not find."""

    async def get_outcomes(self, queue: str, task_ids: Sequence[str]) -> list[TaskOutcome | None]:
        """:meth:`get_tasks` narrowed to what a workflow node reads of its dependencies
        before it runs (state, result, last error, headers), in one round trip: the node's
        start waits for it, and a whole task row is several times the bytes and decoding."""

    async def move_task(self, move: TaskMove) -> TaskInfo | None:
        """Move one task as :class:`TaskMove` says, with its follow-ups, if it is still in
        ``move.expect``; the task after the move (before it, when deleted), or ``None`` when
        the fence failed (moved meanwhile, or gone)."""

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """One group by its queue and id; GroupNotFoundError if absent (or expired)."""

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord:
        """A workflow's record with its nodes' tasks read at the same time (each node's
        state ``None`` when its task is gone); WorkflowNotFoundError if absent."""

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """Workflow records newest first (creation time, then id, both descending), within
        the query's creation bounds, after its cursor, with their nodes' tasks as
        :meth:`get_workflow` reads them."""

    async def request_cancel(self, queue: str, task_id: str) -> TaskInfo | None:
        """Flag an active task so its worker cancels the handler (W12); ``None`` if the
        task is not active (or gone)."""

    async def rewrite_task(self, rewrite: TaskRewrite) -> bool:
        """Replace a task's payload and result bytes if the fences of :class:`TaskRewrite`
        hold; whether it did."""

    async def move_all(self, queue: str, state: TaskState, to: TaskState | None) -> int:
        """Move every task of ``queue`` in ``state`` as :class:`TaskMove` would (``to``
        pending or ``None``: deleted), in short batches; how many. QueueNotFoundError if the
        queue is unknown."""

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue``; enqueue still works (W8)."""

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Worker processes whose last heartbeat is younger than :data:`WORKER_VISIBLE_FOR`."""

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """Flow-control keys (of one queue, or all) that a claim has counted, by queue and
        key: running attempts, the limit, tokens left, tasks held back."""

    async def set_limit(self, change: LimitOverride) -> None:
        """W23: store an override of one key's limit, atomically with claims (creating the
        key's counter if no claim has counted it) and wake the queue's idle workers, so
        the next claim applies it. QueueNotFoundError if the queue is unknown."""

    async def reset_limit(self, queue: str, key: str) -> bool:
        """W23: remove the override of one key (the limit tasks carry applies again) and
        wake the queue's idle workers; whether there was one."""

    async def fair_partitions(self, queue: str, top: int = 20) -> FairDepth:
        """The fair limits (W22) of one queue: per template, and for the ``top``
        partitions with the most tasks, how many wait (pending) and run (active), as
        :class:`FairDepth` orders them; one read. QueueNotFoundError if unknown."""

    async def list_unique(self, queue: str, limit: int = 50) -> UniqueHolds:
        """The unique keys the queue's unfinished tasks hold now (their time not passed),
        each with its task, soonest due first (then id), ``limit`` at most, and how many in
        all. QueueNotFoundError if unknown."""

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name."""

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """One stored schedule; ``None`` if there is none of that name."""

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """Store ``record`` if the stored version is still ``record.version`` (0: none of
        that name is stored); the record as stored (next version, the broker's time in
        ``updated_at``), or ``None`` when the fence failed."""

    async def delete_schedule(self, name: str) -> bool:
        """Delete one stored schedule; whether there was one."""


class FullBroker(Broker, Protocol):
    """What a backend class implements: the hot path, and the admin seam as its ``admin``
    part (another object over the same storage), which the inspector takes directly."""

    @property
    def admin(self) -> Admin:
        """The :class:`Admin` seam of this broker's storage."""
