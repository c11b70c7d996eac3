"""The application object: the task registry, the client (enqueue) and the inspector."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from durq import (
    backoff,
    child_workflows,
    codec,
    continuations,
    durations,
    groups,
    webhooks,
    workflows,
)
from durq import encryption as crypt
from durq.appview import HeaderHook, SendHook
from durq.brokers import FullBroker, open_broker, resolve_url
from durq.brokers.contract import (
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    CAP_CROSS_QUEUE_GROUPS,
    CAP_DEPENDENCIES,
    CAP_SYNC_CONNECTION_ENQUEUE,
    SyncConnectionEnqueue,
)
from durq.brokers.params import (
    EnqueueOutcome,
    EnqueueParams,
    SignalParams,
    TwinReplace,
    UniqueRelease,
)
from durq.clock import SYSTEM_CLOCK, Clock
from durq.codec import DEFAULT_MAX_PAYLOAD, DEFAULT_MAX_RESULT
from durq.encryption import Encryption
from durq.errors import (
    ConfigurationError,
    DuplicateTaskError,
    InvalidStateError,
    PayloadError,
    TaskNotFoundError,
    ValidationError,
)
from durq.groups import Group
from durq.limits import LimitOption, as_limits
from durq.names import check_queue, check_type
from durq.options import (
    DEFAULT_ARCHIVED_RETENTION,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_SNOOZES,
    DEFAULT_RETENTION,
    ArchivedRetentionOption,
    Duration,
    EnqueueRequest,
    Moment,
    PlainEnqueue,
    TaskDefaults,
    archived_policy,
    build_params,
    check_priority,
    make_request,
    new_task_id,
    plain_enqueue,
)
from durq.payloads import validate
from durq.periodic import PeriodicEntry, PeriodicRegistry
from durq.results import wait_for_end
from durq.schedules import StoredSchedules
from durq.states import FINISHED
from durq.steps import check_signal_name
from durq.sync import SyncRunner
from durq.task import TaskInfo
from durq.taskdef import TaskDecorator as TaskDecorator
from durq.taskdef import TaskDef as TaskDef
from durq.uniqueness import (
    DEBOUNCE_HEADER,
    OnConflict,
    Unique,
    as_unique,
    debounce_header,
)
from durq.workflows import Workflow, WorkflowInfo

if TYPE_CHECKING:
    from durq.inspector import Inspector
    from durq.worker.hooks import WorkerHooks
    from durq.worker.server import Worker

T = TypeVar("T")
R = TypeVar("R")
#: A NUL character in JSON text (an escape not itself escaped): PostgreSQL cannot store it.
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

_THEN_FIELDS = (
    "type",
    "queue",
    "on_archived",
    "on_completed",
    "max_retry",
    "timeout",
    "retention",
    "priority",
)


#: How often one enqueue meets a twin that moves on (starts, finishes, lets its key go)
#: before it gives up: each round is a fenced step, so only a storm of twins ends here.
_TWIN_ROUNDS = 8
#: The most task types whose plain enqueue is kept (names an app enqueues; more are
#: checked on each call, as any other enqueue).
_PLAINS_MAX = 1000
#: The type durq's own workflow nodes are validated under before they take their own.
_OWN = "durq-own-node"


class App:
    """A durq application: register handlers with :meth:`task`, enqueue with :meth:`enqueue`.

    ``broker`` is a URL (``sqlite:///durq.sqlite3``, ``postgresql://…``, ``redis://…``) or a
    broker object; without it ``DURQ_BROKER_URL`` or the SQLite default is used. The
    same app object serves web handlers (enqueue) and workers (``durq worker module:app``).

    ``encryption``: :class:`durq.Encryption` keys that payloads and results are stored
    encrypted with (default: from ``DURQ_ENCRYPTION_KEYS``, else none; see
    :mod:`durq.encryption`). ``archived_retention``: how long the janitor keeps archived
    tasks after they were archived: a duration, ``None`` (keep them), or a mapping of queue
    -> duration or ``None`` with ``"*"`` for the other queues; default 7 days."""

    def __init__(
        self,
        broker: str | FullBroker | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        default_queue: str = "default",
        webhook_secret: str | None = None,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        max_result: int = DEFAULT_MAX_RESULT,
        encryption: Encryption | None = None,
        archived_retention: ArchivedRetentionOption = DEFAULT_ARCHIVED_RETENTION,
    ) -> None:
        for name, limit in (
            ("max_payload", max_payload),
            ("max_header_bytes", max_header_bytes),
            ("max_result", max_result),
        ):
            if not isinstance(limit, int) or limit <= 0:
                raise ConfigurationError(f"{name} must be a positive number of bytes")
        self.clock = clock
        self.max_payload = max_payload
        #: Bound on the total size of the headers a caller gives one task.
        self.max_header_bytes = max_header_bytes
        #: Bound on a handler's encoded result; a larger one fails the attempt.
        self.max_result = max_result
        self.default_queue = check_queue(default_queue)
        #: Keys payloads and results are sealed with (durq.encryption); from
        #: DURQ_ENCRYPTION_KEYS when not given; ``None``: stored in the clear.
        self.encryption = encryption if encryption is not None else Encryption.from_env()
        #: How long the janitor keeps archived tasks, per queue (see :func:`archived_policy`).
        self.archived_retention = archived_policy(archived_retention)
        self.tasks: dict[str, TaskDef[Any, Any]] = {}
        self.header_hooks: list[HeaderHook] = []
        #: Called with every task this app created (not with refused ones), e.g. metrics.
        self.enqueue_hooks: list[Callable[[TaskInfo], None]] = []
        #: Wrap every enqueue's broker call, e.g. in a producer span.
        self.send_hooks: list[SendHook] = []
        #: Hooks every worker of this app runs around tasks (metrics, tracing).
        self.worker_hooks: list[WorkerHooks] = []
        if broker is None or isinstance(broker, str):
            self.broker_url: str | None = resolve_url(broker)
            self._given: FullBroker | None = None
        else:
            self.broker_url = getattr(broker, "url", None)
            self._given = broker
        # An async broker is bound to the event loop it connected on; keep one per loop so
        # the app works from uvicorn, tests and scripts alike.
        self._brokers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FullBroker] = (
            weakref.WeakKeyDictionary()
        )
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._sync: SyncRunner | None = None
        # WSGI servers call the sync face from many threads at once: start one runner only.
        self._sync_lock = threading.Lock()
        # The broker whose enqueue_sync_in writes into callers' sync connections: it never
        # connects (the caller's connection does the work), so one serves every call.
        self._sync_joiner: FullBroker | None = None
        self._inspector: Inspector | None = None
        #: Per task type: what its plain enqueue takes from it (see :meth:`_plain`).
        self._plains: dict[str, tuple[TaskDef[Any, Any] | None, str, PlainEnqueue | None]] = {}
        # -- periodic tasks and webhooks (durq.periodic, durq.webhooks) --
        #: The periodic entries that schedulers of this app enqueue.
        self.schedules = PeriodicRegistry(self)
        #: The schedules kept in the broker, and run-time actions (trigger, backfill).
        self.stored_schedules = StoredSchedules(self)
        #: Options of the webhook deliveries this app's tasks ask for (set by install).
        self.webhook_options = webhooks.DEFAULT_OPTIONS
        webhooks.install(self, webhook_secret)  # only with a secret (or DURQ_WEBHOOK_SECRET)
        child_workflows.install(self)  # the node that ends ctx.run_workflow's wait
        #: Creates the workflows tasks start with ``ctx.run_workflow``.
        self.child_workflows = child_workflows.ChildWorkflows(self)

    # -- registry ---------------------------------------------------------------------------

    def task(
        self,
        type: str,
        *,
        queue: str | None = None,
        max_retry: int = 25,
        timeout: Duration | None = None,
        retention: Duration | None = None,
        unique: Duration | Unique | None = None,
        retry_delay: str | backoff.RetryDelay | None = None,
        priority: int = 0,
        limit: LimitOption = None,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
    ) -> TaskDecorator:
        """Register a handler for task ``type``.

        ``retention``: how long a completed task and its result are kept (default an hour,
        :data:`~durq.options.DEFAULT_RETENTION`; ``0`` deletes it at once).
        ``priority``: the default of its tasks (see :meth:`enqueue`).
        ``retry_delay`` is a callable ``(retried, exc) -> seconds`` or a policy name:
        ``"exponential"`` (default, capped, with jitter) or ``"capped_power_of_two"``
        (``min(2**n, 300)`` s). ``limit``: one :class:`durq.Limit` or several, enforced
        across every worker (an enqueue's ``limit=`` replaces them). ``max_snoozes``: how
        often a task may snooze (:class:`durq.Snooze`) before it is archived ("snoozed too
        often")."""
        check_type(type)
        if isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or max_snoozes < 0:
            raise ConfigurationError(f"max_snoozes must be an int >= 0, not {max_snoozes!r}")
        keep = durations.seconds(retention)
        defaults = TaskDefaults(
            queue=check_queue(queue or self.default_queue),
            max_retry=max_retry,
            timeout=durations.seconds(timeout),
            retention=DEFAULT_RETENTION if keep is None else keep,
            unique=as_unique(unique),
            priority=check_priority(priority),
            limits=as_limits(limit),
        )
        policy = backoff.resolve(retry_delay)

        def decorator(fn: Callable[..., Any]) -> TaskDef[Any, Any]:
            if type in self.tasks:
                raise ConfigurationError(f"task type {type!r} is registered twice")
            task_def: TaskDef[Any, Any] = TaskDef(self, type, fn, defaults, policy, max_snoozes)
            self.tasks[type] = task_def
            return task_def

        return cast(TaskDecorator, decorator)

    # -- periodic tasks (durq.periodic) -------------------------------------------------------

    def periodic(self, schedule: str, **options: Any) -> Callable[[Any], TaskDef[Any, Any]]:
        """Run the decorated handler on a schedule: ``@app.periodic("*/5 * * * *",
        tz="Europe/Moscow")`` or ``@app.periodic("@every 30s")``. Registers the task type
        (``type=``, default the function name) unless given a task; see
        :meth:`durq.periodic.PeriodicRegistry.decorator` for the options."""
        return self.schedules.decorator(schedule, **options)

    def add_periodic(self, schedule: str, type: str, **options: Any) -> PeriodicEntry:
        """Declare a schedule for an existing task type (``payload=``, ``queue=``, ``tz=``,
        ``missed="skip"|"run_once"``, ``name=``…); see :meth:`durq.periodic.PeriodicRegistry.add`."""
        return self.schedules.add(schedule, type, **options)

    def load_periodic(self, path: str | os.PathLike[str]) -> list[PeriodicEntry]:
        """Declare the ``[[periodic]]`` entries of a TOML file."""
        return self.schedules.load(os.fspath(path))

    # -- brokers ----------------------------------------------------------------------------

    def new_broker(self) -> FullBroker:
        """A fresh, unconnected broker on the app's storage (workers own their connections)."""
        if self.broker_url is not None:
            return open_broker(self.broker_url, clock=self.clock)
        assert self._given is not None
        return self._given

    def worker_broker(self) -> tuple[FullBroker, bool]:
        """The broker a worker starting on the running loop uses, and whether the worker owns
        it (closes it when it stops): the loop's connected broker if the app has one (a web
        process that runs its worker inside), else a fresh one. A fresh one also serves the
        app's enqueues on this loop while the worker runs (:meth:`release` ends that), so
        handlers that enqueue use the worker's connections rather than a second pool."""
        loop = asyncio.get_running_loop()
        broker = self._brokers.get(loop)
        if broker is not None:
            return broker, False
        broker = self.new_broker()
        owned = broker is not self._given
        if owned:
            self._brokers[loop] = broker
        return broker, owned

    def release(self, broker: FullBroker) -> None:
        """Stop serving the running loop's enqueues with a worker's ``broker`` (before the
        worker closes it); the next enqueue opens the app's own."""
        loop = asyncio.get_running_loop()
        if self._brokers.get(loop) is broker:
            del self._brokers[loop]

    def given(self, broker: FullBroker) -> bool:
        """Whether ``broker`` is the one this app was built with: its caller owns it, so
        neither the app nor its workers close it."""
        return broker is self._given

    async def broker(self) -> FullBroker:
        """The connected broker for the running event loop."""
        loop = asyncio.get_running_loop()
        broker = self._brokers.get(loop)
        if broker is not None:
            return broker
        lock = self._locks.setdefault(loop, asyncio.Lock())
        async with lock:
            broker = self._brokers.get(loop)
            if broker is None:
                broker = self._given if self._given is not None else self.new_broker()
                await broker.connect()
                self._brokers[loop] = broker
        return broker

    async def close(self) -> None:
        """Close the broker of the running loop (and the sync face's, if it was used)."""
        await self._close_loop_broker()
        self.close_sync()

    async def _close_loop_broker(self) -> None:
        broker = self._brokers.pop(asyncio.get_running_loop(), None)
        if broker is not None and broker is not self._given:
            await broker.close()

    def close_sync(self) -> None:
        """Close the sync face's broker and loop (a later sync call opens them again)."""
        if self._sync is not None:
            self._sync.run(self._close_loop_broker)
            self._sync.close()
            self._sync = None

    @property
    def broker_target(self) -> str | FullBroker:
        """What the app opens brokers on: its URL, or the broker object it was given."""
        if self._given is not None:
            return self._given
        assert self.broker_url is not None
        return self.broker_url

    def rebind(
        self, broker: str | FullBroker | None = None, *, clock: Clock | None = None
    ) -> dict[asyncio.AbstractEventLoop, FullBroker]:
        """Point the app at another broker (URL or object; ``None`` keeps it) and clock; the
        testing kit uses it.

        The sync face is closed (call this outside it). Brokers opened on event loops before
        are forgotten and returned by loop, for the caller to close the one of its own loop."""
        self.close_sync()
        self._sync_joiner = None
        dropped = {loop: b for loop, b in self._brokers.items() if b is not self._given}
        self._brokers = weakref.WeakKeyDictionary()
        self._locks = weakref.WeakKeyDictionary()
        if isinstance(broker, str):
            self.broker_url, self._given = resolve_url(broker), None
        elif broker is not None:
            self.broker_url, self._given = getattr(broker, "url", None), broker
        if clock is not None:
            self.clock = clock
        return dropped

    async def __aenter__(self) -> App:
        await self.broker()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- enqueue ----------------------------------------------------------------------------

    def params(self, request: EnqueueRequest) -> EnqueueParams:
        """Validate a request into broker params, without touching the broker."""
        task_def = self.tasks.get(request.type)
        if task_def is not None:
            defaults = task_def.defaults
            payload = validate(task_def.shape.model, request.payload)
        else:
            defaults = TaskDefaults(queue=self.default_queue)
            payload = validate(None, request.payload)
        params = build_params(
            request,
            defaults=defaults,
            now=self.clock.now(),
            payload_json=payload,
            max_payload=self.max_payload,
            max_header_bytes=self.max_header_bytes,
        )
        if self.header_hooks:
            headers = dict(params.headers)
            for hook in self.header_hooks:
                hook(headers)
            params = replace(params, headers=headers)
        if self.encryption is not None:  # after the unique key: a digest of the plain payload
            params = replace(params, payload=self.encryption.seal(params.payload))
        if request.then is None and not params.headers:
            return params  # the common call: no follow-up, no webhook to look at
        params = self._with_then(params, request.then)
        # A webhook header: valid URL, delivery options recorded with the task.
        return webhooks.prepare(params, self.webhook_options)

    def _plain(self, name: str) -> PlainEnqueue | None:
        """The :class:`PlainEnqueue` of task type ``name`` (registered or not), kept per
        type; ``None`` when its plain enqueue takes the general path: header hooks or
        encryption change every task, a unique key or limits of the type's read the payload,
        and a name or default that fails a check raises there, with the general path's
        message."""
        if self.header_hooks or self.encryption is not None or not isinstance(name, str):
            return None
        task_def = self.tasks.get(name)
        kept = self._plains.get(name)
        # Kept while the type's registration and the app's default queue are those it was
        # built from (a type enqueued before it was registered is built again).
        if kept is not None and kept[0] is task_def and kept[1] is self.default_queue:
            return kept[2]
        try:
            if task_def is not None:
                plain = plain_enqueue(name, task_def.defaults, task_def.shape.model)
            else:
                plain = plain_enqueue(name, TaskDefaults(queue=self.default_queue), None)
        except ValidationError:
            return None
        if len(self._plains) < _PLAINS_MAX:
            self._plains[name] = (task_def, self.default_queue, plain)
        return plain

    def _with_then(self, params: EnqueueParams, then: Any) -> EnqueueParams:
        """Resolve ``then=`` into the ``durq-then`` header, or check one given as a header."""
        if then is not None:
            header = continuations.resolve(then, params.queue, self)
            return replace(params, headers={**params.headers, continuations.HEADER: header})
        if continuations.HEADER in params.headers:
            try:
                spec = continuations.spec_of(params.headers)
            except ValueError as exc:
                raise ValidationError(str(exc)) from None
            assert spec is not None
            header = continuations.resolve(
                continuations.Then(**{k: v for k, v in spec.items() if k in _THEN_FIELDS}),
                params.queue,
                self,
            )
            return replace(params, headers={**params.headers, continuations.HEADER: header})
        return params

    @staticmethod
    def _check_follow_up_queue(broker: FullBroker, params: EnqueueParams) -> None:
        if params.after:
            _check_after(broker, params)
        if CAP_CROSS_QUEUE_FOLLOW_UPS in broker.capabilities:
            return
        spec = continuations.spec_of(params.headers)
        if spec is not None and spec["queue"] != params.queue:
            raise ValidationError(
                f"the {broker.name} broker cannot create a follow-up in another queue "
                f"atomically: Then(queue=...) must be {params.queue!r}"
            )
        if webhooks.HEADER_URL in params.headers:
            hook_queue = webhooks.options_of(params.headers).get("queue")
            if hook_queue is not None and hook_queue != params.queue:
                raise ValidationError(
                    f"the {broker.name} broker cannot create a webhook delivery in another "
                    f"queue atomically: install(queue=...) must be None or {params.queue!r}"
                )

    async def enqueue(
        self,
        type: str | TaskDef[Any, Any],
        payload: Any = None,
        *,
        queue: str | None = None,
        task_id: str | None = None,
        process_in: Duration | None = None,
        process_at: Moment | None = None,
        max_retry: int | None = None,
        timeout: Duration | None = None,
        deadline: Moment | None = None,
        retention: Duration | None = None,
        unique: Duration | Unique | None = None,
        priority: int | None = None,
        headers: Mapping[str, str] | None = None,
        connection: Any = None,
        webhook: str | None = None,
        then: continuations.Then | str | None = None,
        limit: LimitOption = None,
        after: Sequence[TaskInfo | str] = (),
        on_conflict: OnConflict | None = None,
    ) -> TaskInfo:
        """Enqueue one task and return its :class:`TaskInfo`.

        Raises :class:`~durq.TaskIDConflictError` when ``task_id`` exists,
        :class:`~durq.DuplicateTaskError` while a twin holds its ``unique`` key (``unique=``:
        a ttl, or :class:`durq.Unique` for chosen payload fields, a period and
        ``on_conflict="return"``, which returns the twin instead; see
        ``docs/uniqueness.md``; ``on_conflict`` overrides the ``Unique``'s for this call),
        :class:`~durq.PayloadError` for a bad payload,
        :class:`~durq.InvalidNameError` for an invalid name or id (a ``task_id`` is letters,
        digits and ``_ . : - @ + = /``, up to 200 characters, not ``.`` or ``..``) or a
        type of durq's own (``durq:...``, reserved), and
        :class:`~durq.BrokerUnavailableError` when the broker cannot be reached.
        ``priority``: an integer from -100 to 100 (default: the task type's, else 0); within
        its queue a higher one is claimed first, then the earlier due time, then the earlier
        enqueue. InvalidPriorityError outside the range.
        ``connection``: an open SQL connection whose transaction the task joins.
        ``webhook``: an http(s) URL that receives the result or final error by signed POST
        (see :mod:`durq.webhooks`); ValidationError for any other URL.
        ``then``: a follow-up task (:class:`durq.Then` or a task type) enqueued atomically
        with this task's completion (see :mod:`durq.continuations`).
        ``limit``: :class:`durq.Limit` (one or several) for this task instead of its type's.
        ``after``: tasks (``TaskInfo``, or ids in this task's queue) this one waits for: it
        is stored ``waiting`` and becomes pending when the last of them has finished
        (completed, archived, cancelled or deleted); see ``docs/dependencies.md``."""
        if (
            queue is None
            and task_id is None
            and process_in is None
            and process_at is None
            and max_retry is None
            and timeout is None
            and deadline is None
            and retention is None
            and unique is None
            and priority is None
            and headers is None
            and connection is None
            and webhook is None
            and then is None
            and limit is None
            and not after
            and on_conflict is None
        ):
            # The plain call (a type and a payload): what its type decides was checked once.
            plain = self._plain(type.type if isinstance(type, TaskDef) else type)
            if plain is not None:
                params = plain.params(payload, self.max_payload)
                broker = self._brokers.get(asyncio.get_running_loop()) or await self.broker()
                return await self._insert(broker, params, None)
        request = self._request(
            type,
            payload,
            webhook=webhook,
            headers=headers,
            queue=queue,
            task_id=task_id,
            process_in=process_in,
            process_at=process_at,
            max_retry=max_retry,
            timeout=timeout,
            deadline=deadline,
            retention=retention,
            unique=unique,
            priority=priority,
            then=then,
            limit=limit,
            after=after,
            on_conflict=on_conflict,
        )
        return await self.enqueue_request(request, connection=connection)

    async def enqueue_request(self, request: EnqueueRequest, *, connection: Any = None) -> TaskInfo:
        """:meth:`enqueue` of a request built beforehand (an adapter's, e.g. Django's), with
        the same checks, hooks and errors."""
        params = self.params(request)
        # The loop's broker without awaiting broker() (a coroutine per call) once it exists.
        broker = self._brokers.get(asyncio.get_running_loop()) or await self.broker()
        if params.after or params.headers:
            self._check_follow_up_queue(broker, params)
        # The common case (no unique key, or inside the caller's transaction) asks nothing more.
        unique = None if params.unique_key is None else self._unique_of(request)
        if unique is not None and unique.debounce is not None:
            # Debounced: the first of a burst runs ``wait`` after it (later ones move it);
            # the header lets the inspector show when it runs at the latest.
            headers = {**params.headers, DEBOUNCE_HEADER: debounce_header(unique.debounce)}
            params = replace(
                params, process_in=unique.debounce[0], process_at=None, headers=headers
            )
        if unique is None or connection is not None:
            return await self._insert(broker, params, connection)
        for _ in range(_TWIN_ROUNDS):
            try:
                return await self._insert(broker, params, None)
            except DuplicateTaskError as exc:
                twin = await self._twin(broker, request, params, unique, exc)
                if twin is not None:
                    return twin
        raise DuplicateTaskError(
            f"the twin of this {params.type!r} task in {params.queue!r} kept changing"
        )

    async def _insert(self, broker: FullBroker, params: EnqueueParams, connection: Any) -> TaskInfo:
        if not self.send_hooks:  # the common case: no ExitStack per call
            return self._created(await broker.enqueue(params, connection=connection))
        with self._sending([params]) as (sent,):
            info = await broker.enqueue(sent, connection=connection)
        return self._created(info)

    async def _twin(
        self,
        broker: FullBroker,
        request: EnqueueRequest,
        params: EnqueueParams,
        unique: Unique,
        refused: DuplicateTaskError,
    ) -> TaskInfo | None:
        """What an enqueue refused for its twin ``refused.existing_id`` gives: the twin, or
        ``None`` to insert again (the twin let its key go, or is gone); raises ``refused``
        when the enqueue should. Each step is fenced in the broker, so racing enqueues of
        twins still create one task."""
        twin_id, key = refused.existing_id, params.unique_key
        if twin_id is None or key is None:
            raise refused
        released = unique.released_in
        if released and await broker.free_unique(
            UniqueRelease(params.queue, twin_id, key, released)
        ):
            return None  # it has started (or moved on): its key is free for this task
        mode = request.on_conflict or unique.on_conflict
        if mode == "raise":
            raise refused
        if mode == "replace":
            changed = await broker.replace_twin(self._replacement(request, params, unique, twin_id))
            if changed is not None:
                return changed
        try:
            twin = await broker.admin.get_task(params.queue, twin_id)
        except TaskNotFoundError:
            return None  # finished and deleted since: its key is free
        if twin.state in FINISHED:
            return None  # finished since: its key is free
        if mode == "replace" and twin.state not in unique.released_in:
            raise refused  # it runs, or waits for other tasks: never changed
        return twin if mode == "return" else None

    def _replacement(
        self, request: EnqueueRequest, params: EnqueueParams, unique: Unique, twin_id: str
    ) -> TwinReplace:
        """The change an enqueue asks of its waiting twin (``on_conflict="replace"``)."""
        assert params.unique_key is not None
        delay = params.process_in
        if params.process_at is not None:
            delay = max(0.0, params.process_at - self.clock.now())
        within = None
        if unique.debounce is not None:
            delay, within = unique.debounce
        return TwinReplace(
            params.queue,
            twin_id,
            params.unique_key,
            params.payload,
            delay=delay,
            within=within,
            priority=None if request.priority is None else params.priority,
        )

    def _unique_of(self, request: EnqueueRequest) -> Unique | None:
        """The :class:`Unique` of an enqueue: its own ``unique=``, else its type's."""
        if request.unique is not None:
            return as_unique(request.unique)
        task_def = self.tasks.get(request.type)
        return task_def.defaults.unique if task_def is not None else None

    @contextlib.contextmanager
    def _sending(self, params: list[EnqueueParams]) -> Iterator[list[EnqueueParams]]:
        with contextlib.ExitStack() as stack:
            for hook in self.send_hooks:
                params = stack.enter_context(hook(params))
            yield params

    @staticmethod
    def _request(
        type: str | TaskDef[Any, Any],
        payload: Any,
        *,
        webhook: str | None = None,
        headers: Mapping[str, str] | None = None,
        **options: Any,
    ) -> EnqueueRequest:
        """The request of one ``enqueue`` call (also the sync face's)."""
        if webhook is not None:
            headers = webhooks.with_webhook(headers, webhook)
        name = type.type if isinstance(type, TaskDef) else type
        return make_request(type=name, payload=payload, headers=headers or {}, **options)

    def decrypted(self, info: TaskInfo) -> TaskInfo:
        """``info`` with its encrypted payload and result decrypted with this app's keys
        (:mod:`durq.encryption`); as it is when nothing is encrypted. EncryptionError when a
        key is missing. The inspector never decrypts: its displays show "encrypted"."""
        keys = self.encryption
        if not (crypt.sealed(info.raw_payload) or crypt.sealed(info.raw_result)):
            return info
        return info.replace(
            raw_payload=crypt.plain(info.raw_payload, keys),
            raw_result=crypt.plain(info.raw_result, keys),
        )

    def _created(self, info: TaskInfo) -> TaskInfo:
        if self.encryption is not None:  # the caller gets back its payload, not ciphertext
            info = self.decrypted(info)
        for hook in self.enqueue_hooks:
            hook(info)
        return info

    async def enqueue_many(
        self, requests: Iterable[EnqueueRequest], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """Enqueue many tasks in one round trip; one outcome per request, in order.

        Every request is validated before anything is written; a refused item (conflict,
        duplicate) is reported in its outcome and does not stop the others."""
        params = [self.params(r) for r in requests]
        broker = await self.broker()
        for p in params:
            self._check_follow_up_queue(broker, p)
        with self._sending(params) as sent:
            outcomes = await broker.enqueue_many(sent, connection=connection)
        for outcome in outcomes:
            if outcome.info is not None:
                self._created(outcome.info)
        return outcomes

    async def enqueue_group(
        self,
        requests: Iterable[EnqueueRequest],
        *,
        then: continuations.Then | str | None = None,
        retention: Duration | None = None,
    ) -> Group:
        """Enqueue the tasks of ``requests`` as one group: all are created, or none (the
        first refused member raises its TaskIDConflictError / DuplicateTaskError).

        ``then``: the follow-up (:class:`durq.Then` or a task type), created with the
        members in the state ``waiting`` (``app.wait(group.then_id)`` works at once) and
        released exactly once, when the last member has finished (completed, archived or
        deleted), with every member's id, state and result or error (see
        :mod:`durq.groups`); its id is checked with the members'. ``retention``: how long
        the group's record stays visible after that (default one day)."""
        params = [self.params(r) for r in requests]
        keep = durations.seconds(retention)
        group = groups.build(
            new_task_id(),
            params,
            then,
            self,
            retention=groups.DEFAULT_RETENTION if keep is None else keep,
            max_payload=self.max_payload,
        )
        broker = await self.broker()
        for p in group.members:
            self._check_follow_up_queue(broker, p)
        if CAP_CROSS_QUEUE_GROUPS not in broker.capabilities:
            queues = {p.queue for p in group.members}
            if group.then is not None:
                queues.add(group.then.queue)
            if len(queues) > 1:
                raise ValidationError(
                    f"this {broker.name} broker keeps a group in one queue: its members and "
                    f"its follow-up must all be in {group.queue!r}, not {sorted(queues)}"
                )
        with self._sending(list(group.members)) as sent:
            infos = await broker.enqueue_group(replace(group, members=tuple(sent)))
        for info in infos:
            self._created(info)
        return Group(group.id, group.queue, tuple(infos), group.then.id if group.then else None)

    async def enqueue_workflow(self, workflow: Workflow) -> WorkflowInfo:
        """Create every node of ``workflow`` as a task, all or none, in one atomic broker
        step: nodes that wait for none are pending (or scheduled) at once, the others
        ``waiting`` until the last node they wait for has finished. Raises WorkflowError
        (an ``after=`` name that is no node), WorkflowCycleError (naming the cycle), the
        first refused node's TaskIDConflictError / DuplicateTaskError (nothing created),
        ValidationError on a broker that keeps one atomic step in one queue (a Redis
        Cluster) for nodes in several queues. Wait for it with ``app.wait(info)``; see
        :mod:`durq.workflows`."""
        order = workflow.order()
        broker = await self.broker()
        if CAP_DEPENDENCIES not in broker.capabilities:
            raise ConfigurationError(f"the {broker.name} broker does not support workflows")
        created: dict[str, EnqueueParams] = {}
        for name in order:
            node, payload, policy, options = workflow.spec(name)
            options.setdefault("task_id", workflow.node_id(name))
            if workflow.queue is not None:
                options.setdefault("queue", workflow.queue)
            own = name in workflow._own_nodes
            # durq's own node takes a type callers may not enqueue: built under another.
            params = self.params(self._request(_OWN if own else node.type, payload, **options))
            if own:
                params = replace(params, type=node.type)
            after = {dep: created[dep] for dep in workflow.after(name)}
            header = workflows.node_header(
                workflow, name, policy, {d: (p.queue, p.id) for d, p in after.items()}
            )
            created[name] = replace(
                params,
                retention=max(params.retention, workflow.retention),
                after=tuple((p.queue, p.id) for p in after.values()),
                headers={**params.headers, workflows.HEADER: header},
            )
            self._check_follow_up_queue(broker, replace(created[name], after=()))
        queues = {p.queue for p in created.values()}
        if CAP_CROSS_QUEUE_GROUPS not in broker.capabilities and len(queues) > 1:
            raise ValidationError(
                f"this {broker.name} broker creates a workflow in one atomic step within one "
                f"queue: its nodes must all be in one queue, not {sorted(queues)}"
            )
        record = workflows.record_of(workflow, order, created)
        with self._sending(list(created.values())) as sent:
            infos = await broker.enqueue_graph(sent, record)
        nodes = {name: self._created(info) for name, info in zip(order, infos, strict=True)}
        return WorkflowInfo(
            workflow.id, workflow.name, nodes, workflow.finals(), workflow.final_groups()
        )

    async def cancel_workflow(self, workflow: WorkflowInfo | str) -> int:
        """Cancel every node of the workflow (as created, or by its id: its stored record
        names its nodes; WorkflowNotFoundError if there is none) that has not finished:
        waiting, pending, scheduled and retry nodes are archived "cancelled" at once,
        running ones are cancelled by their workers. Returns how many nodes were
        cancelled; ``app.wait`` on the workflow then raises WorkflowFailedError."""
        if isinstance(workflow, str):
            return await self.inspector.cancel_workflow(workflow)
        nodes = [(t.queue, t.id) for t in workflow.nodes.values()]
        return await workflows.cancel((await self.broker()).admin, nodes)

    # -- the sync face ------------------------------------------------------------------------

    def _runner(self) -> SyncRunner:
        with self._sync_lock:
            if self._sync is None:
                if self.broker_url is None:
                    raise ConfigurationError("the sync API needs an app built from a broker URL")
                self._sync = SyncRunner()
            return self._sync

    def enqueue_sync(
        self, type: str | TaskDef[Any, Any], payload: Any = None, **options: Any
    ) -> TaskInfo:
        """Blocking :meth:`enqueue` for WSGI code (Flask, Django), with the same semantics.

        With ``connection=`` a *sync* psycopg connection, the task joins its transaction."""
        connection = options.pop("connection", None)
        if connection is not None:
            return self.enqueue_request_sync(
                self._request(type, payload, **options), connection=connection
            )
        return self._runner().run(lambda: self.enqueue(type, payload, **options))

    def enqueue_many_sync(self, requests: Iterable[EnqueueRequest]) -> list[EnqueueOutcome]:
        """Blocking :meth:`enqueue_many`."""
        items = list(requests)
        return self._runner().run(lambda: self.enqueue_many(items))

    def enqueue_request_sync(self, request: EnqueueRequest, *, connection: Any = None) -> TaskInfo:
        """Blocking :meth:`enqueue_request`. With ``connection=`` a sync SQL connection (a
        ``sqlite3`` one on the broker's file, or psycopg's), the task joins its open
        transaction on the calling thread: ConfigurationError if the broker cannot."""
        if connection is None:
            return self._runner().run(lambda: self.enqueue_request(request))
        with self._sync_lock:
            if self._sync_joiner is None:
                self._sync_joiner = self.new_broker()
            broker = self._sync_joiner
        if CAP_SYNC_CONNECTION_ENQUEUE not in broker.capabilities:
            raise ConfigurationError(f"the {broker.name} broker cannot join a sync connection")
        params = self.params(request)
        self._check_follow_up_queue(broker, params)
        joined = cast(SyncConnectionEnqueue, broker)
        with self._sending([params]) as (sent,):
            result = joined.enqueue_sync_in(sent, connection)
        return self._created(result)

    def enqueue_group_sync(
        self,
        requests: Iterable[EnqueueRequest],
        *,
        then: continuations.Then | str | None = None,
        retention: Duration | None = None,
    ) -> Group:
        """Blocking :meth:`enqueue_group`."""
        items = list(requests)
        return self._runner().run(lambda: self.enqueue_group(items, then=then, retention=retention))

    def enqueue_workflow_sync(self, workflow: Workflow) -> WorkflowInfo:
        """Blocking :meth:`enqueue_workflow`."""
        return self._runner().run(lambda: self.enqueue_workflow(workflow))

    def cancel_workflow_sync(self, workflow: WorkflowInfo | str) -> int:
        """Blocking :meth:`cancel_workflow`."""
        return self._runner().run(lambda: self.cancel_workflow(workflow))

    def run_sync(self, make: Callable[[], Awaitable[R]]) -> R:
        """Run ``make()`` (a coroutine using this app) on the sync face's loop."""
        return self._runner().run(make)

    # -- results ----------------------------------------------------------------------------

    async def wait(
        self,
        task: TaskInfo | WorkflowInfo | str,
        *,
        queue: str | None = None,
        timeout: Duration | None = None,
    ) -> Any:
        """Wait until the task ends and return its result (decoded JSON).

        Given a :class:`~durq.WorkflowInfo`, wait for its final nodes (those no node runs
        after) and return their results by node name, or raise
        :class:`~durq.WorkflowFailedError` with the failed node's error and traceback (see
        :mod:`durq.workflows`).

        ``task`` is the :class:`TaskInfo` enqueue returned, or a task id in ``queue``
        (default: the app's default queue). ``timeout`` bounds the wait (``None``: none).
        Raises :class:`~durq.TaskArchivedError` (with ``last_error`` and ``traceback``) when
        the task failed for good, :class:`~durq.TaskCancelledError` when it was cancelled,
        :class:`~durq.WaitTimeoutError` when ``timeout`` passed first (the task goes on),
        :class:`~durq.TaskNotFoundError` when the task was deleted before its end was read
        (``retention=0`` keeps no result). A task that does not exist yet (a group's
        follow-up, a continuation ``then:<id>``, a task enqueued later) is waited for until
        it exists and ends, within ``timeout``; :class:`~durq.InvalidNameError` for an id
        no task can have.

        The wait is woken by the broker's notification of the task's end, not by polling;
        it also reads the task again every few seconds in case a notification was lost
        (see :mod:`durq.results`)."""
        limit = durations.seconds(timeout)
        if isinstance(task, WorkflowInfo):
            return await workflows.wait_for(await self.broker(), task, limit, self.encryption)
        if isinstance(task, TaskInfo):
            task_id, queue = task.id, queue or task.queue
        else:
            task_id, queue = task, queue or self.default_queue
        check_queue(queue)
        broker = await self.broker()
        info = await wait_for_end(broker, queue, task_id, limit)
        return crypt.decode(info.raw_result, self.encryption)

    def wait_sync(
        self,
        task: TaskInfo | WorkflowInfo | str,
        *,
        queue: str | None = None,
        timeout: Duration | None = None,
    ) -> Any:
        """Blocking :meth:`wait`, for WSGI code and scripts."""
        return self.run_sync(lambda: self.wait(task, queue=queue, timeout=timeout))

    # -- signals ------------------------------------------------------------------------------

    async def signal(
        self,
        task: TaskInfo | str,
        name: str,
        payload: Any = None,
        *,
        queue: str | None = None,
    ) -> bool:
        """Deliver the signal ``name`` with ``payload`` (any JSON value) to a task that waits,
        or will wait, for it with ``ctx.wait_for(name, ...)``: once per task and name.

        ``task`` is a :class:`TaskInfo` or a task id in ``queue`` (default: the app's default
        queue). Returns ``True`` when this call delivered it (a task waiting for it is
        claimable at once, in the same atomic step that stores it; one not waiting yet gets
        it when it waits), ``False`` when a signal of that name was delivered before
        (nothing changes). Raises :class:`~durq.TaskNotFoundError` (no such task),
        :class:`~durq.InvalidStateError` (the task has finished),
        :class:`~durq.PayloadError` (not JSON, too large, or holding a NUL character) and
        :class:`~durq.StepError` (not a signal name: 1-100 letters, digits, ``_ . : -``)."""
        if isinstance(task, TaskInfo):
            task_id, queue = task.id, queue or task.queue
        else:
            task_id, queue = task, queue or self.default_queue
        check_queue(queue)
        check_signal_name(name)
        raw = codec.encode_value(payload, "signal payload", self.max_payload)
        if _NUL.search(raw):
            raise PayloadError("a signal payload cannot hold a NUL character")
        if self.encryption is not None:
            raw = self.encryption.seal(raw)
        broker = await self.broker()
        outcome = await broker.signal(SignalParams(queue, task_id, name, raw.decode()))
        if outcome == "finished":
            raise InvalidStateError(f"task {task_id!r} in queue {queue!r} has finished")
        return outcome in ("woken", "kept")

    def signal_sync(
        self, task: TaskInfo | str, name: str, payload: Any = None, *, queue: str | None = None
    ) -> bool:
        """Blocking :meth:`signal`, for WSGI code and scripts."""
        return self.run_sync(lambda: self.signal(task, name, payload, queue=queue))

    # -- inspector and worker ---------------------------------------------------------------

    @property
    def inspector(self) -> Inspector:
        """The admin facade used by the CLI and the dashboard."""
        if self._inspector is None:
            from durq.inspector import Inspector

            self._inspector = Inspector(self)
        return self._inspector

    def worker(self, **options: Any) -> Worker:
        """A :class:`~durq.worker.server.Worker` for this app (see its options)."""
        from durq.worker.server import Worker

        return Worker(self, **options)

    async def ping(self) -> None:
        """Raise :class:`BrokerUnavailableError` unless the broker answers."""
        await (await self.broker()).ping()


def _check_after(broker: FullBroker, params: EnqueueParams) -> None:
    """A broker that counts dependencies, atomically: across queues only where one atomic
    step may span queues (not a Redis Cluster, where each queue is its own hash slot)."""
    if CAP_DEPENDENCIES not in broker.capabilities:
        raise ConfigurationError(f"the {broker.name} broker does not support after=")
    if CAP_CROSS_QUEUE_GROUPS not in broker.capabilities and any(
        queue != params.queue for queue, _ in params.after
    ):
        raise ValidationError(
            f"the {broker.name} broker cannot count dependencies in other queues atomically: "
            f"after= must name tasks of {params.queue!r}"
        )
