"""Turning user-facing enqueue options into one validated :class:`EnqueueParams`."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from durq import codec, durations, names
from durq.brokers.dependencies import MAX_AFTER
from durq.brokers.params import ArchivedRetention, EnqueueParams
from durq.durations import MAX_DURATION, Duration
from durq.errors import ConfigurationError, InvalidPriorityError, ValidationError
from durq.limits import Limit, LimitOption, as_limits, resolve_all
from durq.payloads import validate
from durq.uniqueness import OnConflict, Unique, as_unique

#: The latest moment durq accepts (9999-01-01 UTC): every broker and ``datetime`` hold it.
MAX_EPOCH = 253_370_764_800.0
#: The most retries a task may ask for (what every broker's integer column holds).
MAX_RETRY = 2**31 - 1
#: The most headers a task may carry, and the default bound on their total size in bytes.
MAX_HEADERS = 100
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
MAX_HEADER_KEY = 200
#: The range of a task's priority: higher runs first within its queue; 0 is the default.
#: Bounded so every broker orders it exactly (Redis folds it into a sorted-set score).
MIN_PRIORITY = -100
MAX_PRIORITY = 100

__all__ = [
    "MAX_DURATION",
    "MAX_EPOCH",
    "MAX_HEADERS",
    "MAX_PRIORITY",
    "MAX_RETRY",
    "MIN_PRIORITY",
    "Duration",
]

Moment = datetime | float | int


@dataclass(frozen=True)
class EnqueueRequest:
    """One task to enqueue, for :meth:`durq.App.enqueue_many`.

    Every field but ``type`` and ``payload`` defaults to the task's registered options."""

    type: str
    payload: Any = None
    queue: str | None = None
    task_id: str | None = None
    process_in: Duration | None = None
    process_at: Moment | None = None
    max_retry: int | None = None
    timeout: Duration | None = None
    deadline: Moment | None = None
    retention: Duration | None = None
    #: ``unique=ttl`` or :class:`durq.Unique` (see :mod:`durq.uniqueness`).
    unique: Duration | Unique | None = None
    #: From :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`; higher is claimed first in its queue.
    priority: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: A continuation: a :class:`durq.Then` or a task type (see :mod:`durq.continuations`).
    then: Any = None
    #: Flow-control limits (:class:`durq.Limit`, one or several), replacing the task type's.
    limit: LimitOption = None
    #: Tasks this one waits for: ``TaskInfo`` objects, or task ids in this task's queue.
    #: It is stored ``waiting`` and becomes pending when the last of them has finished
    #: (completed, archived, cancelled or deleted); one that has finished or is gone already
    #: counts as done.
    after: Sequence[Any] = ()
    #: What an enqueue of a twin does, overriding the :class:`durq.Unique`'s:
    #: ``"raise"`` (:class:`~durq.DuplicateTaskError`) or ``"return"`` (the twin).
    on_conflict: OnConflict | None = None


_REQUEST_DEFAULTS = {f.name: f.default for f in fields(EnqueueRequest) if f.default is not MISSING}
_REQUEST_FIELDS = frozenset(f.name for f in fields(EnqueueRequest))


def make_request(**values: Any) -> EnqueueRequest:
    """The same EnqueueRequest as ``EnqueueRequest(**values)``, without the frozen
    dataclass's per-field ``object.__setattr__`` (its fields set as one dict): every
    ``App.enqueue`` builds one: 1.5 against 3.8 us (timeit, min of 9), about 5 % of the
    client's CPU per enqueue. TypeError for a missing or unknown field."""
    given = {**_REQUEST_DEFAULTS, "headers": {}, **values}
    if given.keys() != _REQUEST_FIELDS:
        raise TypeError(f"EnqueueRequest fields: {sorted(given.keys() ^ _REQUEST_FIELDS)}")
    request = object.__new__(EnqueueRequest)
    object.__setattr__(request, "__dict__", given)
    return request


#: How long a completed task and its result are kept when no ``retention`` is given: long
#: enough to read a result (``app.wait``, ``durq task get``) well after it was written.
#: ``retention=0`` deletes a completed task at once.
DEFAULT_RETENTION = 3600.0
#: Snoozes (:class:`durq.Snooze`) a task may take before it is archived ("snoozed too often").
DEFAULT_MAX_SNOOZES = 100


#: How long an archived task is kept by default, counted from when it was archived: a week
#: (Django's task results are kept as long) leaves a weekend's failures for Monday's triage
#: and a replay with ``durq task run``, while a poison stream cannot fill the broker for ever.
DEFAULT_ARCHIVED_RETENTION = 7 * 86400.0
#: ``App(archived_retention=...)``: a duration for every queue, ``None`` (keep them), or a
#: mapping of queue -> duration or ``None``, with ``"*"`` for the other queues.
ArchivedRetentionOption = Duration | None | Mapping[str, Duration | None]


def archived_policy(option: ArchivedRetentionOption) -> ArchivedRetention:
    """The :class:`~durq.brokers.params.ArchivedRetention` of ``App(archived_retention=...)``;
    ConfigurationError for a bad duration or queue name."""
    try:
        if not isinstance(option, Mapping):
            return ArchivedRetention(durations.seconds(option))
        given = dict(option)
        default = given.pop("*", DEFAULT_ARCHIVED_RETENTION)
        return ArchivedRetention(
            durations.seconds(default),
            {names.check_queue(q): durations.seconds(v) for q, v in given.items()},
        )
    except ValidationError as exc:
        raise ConfigurationError(f"archived_retention: {exc.message}") from None


@dataclass(frozen=True)
class TaskDefaults:
    """Options that a task type (``@app.task``) or the app sets for every enqueue."""

    queue: str = "default"
    max_retry: int = 25
    timeout: float | None = None
    retention: float = DEFAULT_RETENTION
    unique: Unique | None = None
    priority: int = 0
    limits: tuple[Limit, ...] = ()


def new_task_id() -> str:
    """A new task id: 32 hex digits, as random as ``uuid4().hex``."""
    return os.urandom(16).hex()


def epoch(moment: Moment | None, what: str) -> float | None:
    """A moment as epoch seconds; naive datetimes are taken as UTC. ValidationError for a
    moment before 1970 or after :data:`MAX_EPOCH`."""
    if moment is None:
        return None
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        try:
            value = moment.timestamp()
        except (OverflowError, ValueError):
            raise ValidationError(f"{what} is out of range") from None
    elif isinstance(moment, int | float) and not isinstance(moment, bool):
        try:
            value = float(moment)
        except OverflowError:
            raise ValidationError(f"{what} is out of range") from None
    else:
        raise ValidationError(f"{what} must be a datetime or epoch seconds, got {moment!r:.60}")
    if not (math.isfinite(value) and 0 <= value <= MAX_EPOCH):
        raise ValidationError(f"{what} must be a time between 1970 and 9999, got {moment!r:.40}")
    return value


def check_max_retry(value: object) -> int:
    """``value`` if it is an integer from 0 to :data:`MAX_RETRY`; ValidationError otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_RETRY:
        shown = repr(value) if not isinstance(value, int) or value < 10**12 else "a huge number"
        raise ValidationError(f"max_retry must be an integer from 0 to {MAX_RETRY}, got {shown}")
    return value


def check_priority(value: object) -> int:
    """``value`` if it is an integer from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`;
    InvalidPriorityError (a ValidationError) otherwise."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not (MIN_PRIORITY <= value <= MAX_PRIORITY)
    ):
        shown = (
            repr(value) if not isinstance(value, int) or abs(value) < 10**12 else "a huge number"
        )
        raise InvalidPriorityError(
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {shown:.60}"
        )
    return value


def check_headers(headers: Mapping[Any, Any], max_bytes: int) -> dict[str, str]:
    """Headers as text, bounded: at most :data:`MAX_HEADERS`, ``max_bytes`` in all, keys of
    printable characters, no NUL anywhere (a value no broker stores alike)."""
    if len(headers) > MAX_HEADERS:
        raise ValidationError(f"a task has at most {MAX_HEADERS} headers, got {len(headers)}")
    out: dict[str, str] = {}
    total = 0
    for k, v in headers.items():
        key, value = str(k), str(v)
        if not key or len(key) > MAX_HEADER_KEY or not key.isprintable():
            raise ValidationError(
                f"header names are 1-{MAX_HEADER_KEY} printable characters, got {key!r:.60}"
            )
        if "\x00" in value:
            raise ValidationError(f"header {key!r} must not contain NUL characters")
        try:
            total += len(key.encode()) + len(value.encode())
        except UnicodeEncodeError:
            raise ValidationError(f"header {key!r} is not valid text") from None
        if total > max_bytes:
            raise ValidationError(f"headers are over the limit of {max_bytes} bytes")
        out[key] = value
    return out


def build_params(
    request: EnqueueRequest,
    *,
    defaults: TaskDefaults,
    now: float,
    payload_json: Any,
    max_payload: int,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> EnqueueParams:
    """Validate every option at the edge and encode the payload."""
    queue = names.check_queue(defaults.queue if request.queue is None else request.queue)
    task_type = names.check_enqueued_type(request.type)
    task_id = new_task_id() if request.task_id is None else names.check_new_task_id(request.task_id)
    if request.process_in is not None and request.process_at is not None:
        raise ValidationError("give process_in or process_at, not both")
    # The common call gives none of the options below: each is looked at only when given
    # (the handler's single enqueue is the hot path).
    process_at = None if request.process_at is None else epoch(request.process_at, "process_at")
    delay = None if request.process_in is None else durations.seconds(request.process_in)
    process_in: float | None = None
    if delay is not None and delay > 0:
        # Relative: the broker turns it into a moment on its own clock, not ours (ours may be
        # minutes off). Checked against ours only for range.
        epoch(now + delay, "process_in")
        process_in = delay
    if process_at is not None and process_at <= now:
        process_at = None
    max_retry = check_max_retry(
        defaults.max_retry if request.max_retry is None else request.max_retry
    )
    timeout = None if request.timeout is None else durations.seconds(request.timeout)
    if timeout is None:
        timeout = defaults.timeout
    if timeout is not None and timeout <= 0:
        raise ValidationError("timeout must be > 0")
    retention = None if request.retention is None else durations.seconds(request.retention)
    if request.on_conflict not in (None, "raise", "return"):
        raise ValidationError(f"on_conflict is 'raise' or 'return', not {request.on_conflict!r}")
    unique = None if request.unique is None else as_unique(request.unique)
    if unique is None and request.unique is None:
        unique = defaults.unique
    priority = check_priority(defaults.priority if request.priority is None else request.priority)
    payload = codec.encode_payload(payload_json, max_bytes=max_payload)
    unique_key, unique_ttl = (
        (None, None) if unique is None else unique.key(queue, task_type, payload, now, payload_json)
    )
    headers = (
        {}
        if type(request.headers) is dict and not request.headers
        else check_headers(request.headers, max_header_bytes)
    )
    limits = defaults.limits if request.limit is None else as_limits(request.limit)
    after = check_after(request.after, queue) if request.after else ()
    return EnqueueParams(
        id=task_id,
        queue=queue,
        type=task_type,
        payload=payload,
        max_retry=max_retry,
        timeout=timeout,
        deadline=None if request.deadline is None else epoch(request.deadline, "deadline"),
        process_at=process_at,
        process_in=process_in,
        retention=defaults.retention if retention is None else retention,
        unique_key=unique_key,
        unique_ttl=unique_ttl,
        headers=headers,
        priority=priority,
        limits=resolve_all(limits, payload_json) if limits else (),
        after=after,
    )


@dataclass(frozen=True, slots=True)
class PlainEnqueue:
    """What the plain enqueue of one task type takes from its defaults, checked once.

    The plain enqueue is the call a web handler makes on every request: a type and a
    payload, no option. Everything :func:`build_params` would check of such a request but
    its payload depends on the type alone, so it is checked when the type is first
    enqueued and kept here; :meth:`params` then validates and encodes the payload only.
    :func:`plain_enqueue` builds one, for a type whose defaults let it."""

    task_type: str
    queue: str
    max_retry: int
    timeout: float | None
    retention: float
    priority: int
    #: The handler's payload model (``None``: plain JSON data).
    model: type | None

    def params(self, payload: Any, max_payload: int) -> EnqueueParams:
        """The params :func:`build_params` gives a request of this type and ``payload``
        with no option (a new task id each call); PayloadError for a bad payload."""
        data = validate(self.model, payload)
        return EnqueueParams(
            id=new_task_id(),
            queue=self.queue,
            type=self.task_type,
            payload=codec.encode_payload(data, max_bytes=max_payload),
            max_retry=self.max_retry,
            timeout=self.timeout,
            retention=self.retention,
            priority=self.priority,
        )


def plain_enqueue(
    task_type: str, defaults: TaskDefaults, model: type | None
) -> PlainEnqueue | None:
    """The :class:`PlainEnqueue` of ``task_type`` with these defaults, after the checks
    :func:`build_params` makes of them; ``None`` when its enqueue needs the payload for more
    than its bytes (a unique key or limits from the type's defaults: both are read from the
    payload). ValidationError as :func:`build_params` raises it."""
    if defaults.unique is not None or defaults.limits:
        return None
    timeout = defaults.timeout
    if timeout is not None and timeout <= 0:
        raise ValidationError("timeout must be > 0")
    return PlainEnqueue(
        task_type=names.check_enqueued_type(task_type),
        queue=names.check_queue(defaults.queue),
        max_retry=check_max_retry(defaults.max_retry),
        timeout=timeout,
        retention=defaults.retention,
        priority=check_priority(defaults.priority),
        model=model,
    )


def check_after(after: Sequence[Any] | None, queue: str) -> tuple[tuple[str, str], ...]:
    """``(queue, id)`` of each task of ``after=`` (a TaskInfo, or an id in ``queue``), each
    once, in order; ValidationError for anything else or too many."""
    if not after:
        return ()
    if isinstance(after, (str, bytes)) or hasattr(after, "id"):
        after = [after]
    keys: dict[tuple[str, str], None] = {}
    for item in after:
        if isinstance(item, str):
            key = (queue, names.check_task_id(item))
        elif isinstance(getattr(item, "id", None), str) and isinstance(
            getattr(item, "queue", None), str
        ):
            key = (names.check_queue(item.queue), names.check_task_id(item.id))
        else:
            raise ValidationError(f"after= takes TaskInfo objects or task ids, not {item!r}")
        keys[key] = None
    if len(keys) > MAX_AFTER:
        raise ValidationError(f"a task waits for at most {MAX_AFTER} tasks, not {len(keys)}")
    return tuple(keys)
