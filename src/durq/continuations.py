"""Continuations: a follow-up task enqueued when a task finishes, atomically with its outcome.

``await app.enqueue("pdf:render", {...}, then=durq.Then("email:send_pdf", on_archived=True))``
validates the follow-up at enqueue and stores it, fully resolved, in the task's header
``durq-then``. When the task completes (or is archived, with ``on_archived=True``), the
follow-up's :class:`~durq.brokers.params.EnqueueParams` ride on the call that records the
outcome (``CompleteParams.follow_ups`` / ``ArchiveParams.follow_ups``) and the broker writes
both or neither: one SQL transaction, one Lua script. See ``docs/periodic.md``.

The follow-up's id is ``then:<task id>``: one follow-up per task, whichever final outcome
comes first; a second attempt to create it (a rerun archived task) is refused by the task-id
rule and skipped. Its payload::

    {"task": {"id", "queue", "type", "state"}, "payload": <original payload>,
     "result": <result>}            # or "error": <last error> when archived

:func:`build` is a pure function of the finished task, so workers and brokers (for outcomes
decided outside a worker: the rescuer, the inspector's archive and cancel) compose the same
follow-up. :func:`follow_ups` adds the built-in one: the signed webhook delivery
(``durq:webhook``, id ``webhook:<event>:<task id>``, see :mod:`durq.webhooks`) of a task
enqueued with ``webhook=``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from durq import codec, durations, names, webhooks
from durq.brokers.params import EnqueueParams
from durq.errors import InvalidPriorityError, ValidationError
from durq.options import DEFAULT_RETENTION, check_max_retry, check_priority

if TYPE_CHECKING:
    from durq.options import Duration
    from durq.task import TaskInfo
    from durq.taskdef import TaskDef

#: Header of the parent task holding the resolved follow-up (canonical JSON).
HEADER = "durq-then"
#: Header of the follow-up naming the task it follows.
PARENT_HEADER = webhooks.PARENT_HEADER
COMPLETED, ARCHIVED = "completed", "archived"

log = logging.getLogger("durq.continuations")


@dataclass(frozen=True, slots=True)
class Then:
    """A follow-up task of type ``type`` that runs when the enqueued task finishes.

    ``queue``, ``max_retry``, ``timeout``, ``retention`` and ``priority`` default to the
    options the follow-up type is registered with in the enqueuing app (else: the task's own
    queue, 25 retries, no timeout, kept an hour after completion, priority 0).
    ``on_archived``: also run it when the
    task is archived (retries used up, SkipRetry, cancelled, worker lost), with ``"error"``
    in place of ``"result"``; ``on_completed=False`` with it: only then (a failure handler)."""

    type: str
    queue: str | None = None
    on_archived: bool = False
    on_completed: bool = True
    max_retry: int | None = None
    timeout: Duration | None = None
    retention: Duration | None = None
    priority: int | None = None


class TaskTypes(Protocol):
    """Where :func:`resolve` reads a follow-up type's defaults: the app's registry."""

    @property
    def tasks(self) -> Mapping[str, TaskDef[Any, Any]]: ...


def resolve(then: Then | str, task_queue: str, app: TaskTypes) -> str:
    """Validate ``then`` and resolve its defaults; the ``durq-then`` header value.

    Raises :class:`ValidationError` (or InvalidNameError) before anything is written."""
    if isinstance(then, str):
        then = Then(then)
    if not isinstance(then, Then):
        raise ValidationError(f"then must be a durq.Then or a task type, not {then!r}")
    task_type = names.check_enqueued_type(then.type)
    task_def = app.tasks.get(task_type)
    defaults = task_def.defaults if task_def is not None else None
    queue = then.queue or (defaults.queue if defaults is not None else task_queue)
    max_retry = then.max_retry
    if max_retry is None:
        max_retry = defaults.max_retry if defaults is not None else 25
    try:
        max_retry = check_max_retry(max_retry)
    except ValidationError as exc:
        raise ValidationError(f"Then.{exc.message}") from None
    timeout = durations.seconds(then.timeout)
    if timeout is None and defaults is not None:
        timeout = defaults.timeout
    if timeout is not None and timeout <= 0:
        raise ValidationError("Then.timeout must be > 0")
    retention = durations.seconds(then.retention)
    if retention is None:
        retention = defaults.retention if defaults is not None else DEFAULT_RETENTION
    if retention < 0:
        raise ValidationError("Then.retention must be >= 0")
    priority = then.priority
    if priority is None:
        priority = defaults.priority if defaults is not None else 0
    try:
        priority = check_priority(priority)
    except ValidationError as exc:
        raise InvalidPriorityError(f"Then.{exc.message}") from None
    if not then.on_completed and not then.on_archived:
        raise ValidationError("Then runs on completion, on archiving, or both: not on neither")
    spec = {
        "type": task_type,
        "queue": names.check_queue(queue),
        "on_archived": bool(then.on_archived),
        "on_completed": bool(then.on_completed),
        "max_retry": max_retry,
        "timeout": timeout,
        "retention": retention,
    }
    if priority:  # absent when 0: headers of tasks without one stay as they were
        spec["priority"] = priority
    return json.dumps(spec, separators=(",", ":"), sort_keys=True)


def spec_of(headers: dict[str, str]) -> dict[str, Any] | None:
    """The resolved follow-up of a task's headers, or ``None``."""
    raw = headers.get(HEADER)
    if raw is None:
        return None
    spec = json.loads(raw)
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError(f"malformed {HEADER} header: {raw!r}")
    return spec


def follow_up_id(task_id: str) -> str:
    """``then:<task id>``; a digest when that would exceed the task-id length limit."""
    candidate = f"then:{task_id}"
    if len(candidate) <= names.TASK_ID_MAX:
        return candidate
    return "then:sha256:" + hashlib.sha256(task_id.encode()).hexdigest()


def build(
    task: TaskInfo,
    outcome: str,
    *,
    result: bytes | None = None,
    error: str | None = None,
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> tuple[EnqueueParams, ...]:
    """The follow-ups a task asked for, for ``outcome`` (``"completed"``/``"archived"``).

    Empty when it asked for none, or only on completion and was archived. A payload over
    ``max_payload`` loses the result, then the original payload (``"omitted"`` says which):
    the follow-up still runs and can read them from the task while it is retained."""
    spec = spec_of(task.headers)
    if spec is None:
        return ()
    if outcome == ARCHIVED and not spec.get("on_archived"):
        return ()
    if outcome == COMPLETED and not spec.get("on_completed", True):
        return ()
    body: dict[str, Any] = {
        "task": {"id": task.id, "queue": task.queue, "type": task.type, "state": outcome},
        "payload": json_or_none(task.raw_payload),
    }
    if outcome == COMPLETED:
        body["result"] = json_or_none(result)
    else:
        body["error"] = error
    payload = _encode(body, max_payload)
    return (
        EnqueueParams(
            id=follow_up_id(task.id),
            queue=names.check_queue(spec["queue"]),
            type=names.check_type(spec["type"]),
            payload=payload,
            max_retry=int(spec.get("max_retry", 25)),
            timeout=spec.get("timeout"),
            retention=float(spec.get("retention") or 0.0),
            headers={PARENT_HEADER: task.id},
            priority=int(spec.get("priority", 0)),
        ),
    )


def wanted(task: TaskInfo) -> bool:
    """Whether ``task`` may create follow-ups at all (cheap: the hot path asks every task)."""
    headers = task.headers
    return HEADER in headers or webhooks.HEADER_URL in headers


def follow_ups(
    task: TaskInfo,
    outcome: str,
    *,
    result: bytes | None = None,
    error: str | None = None,
    retried: int | None = None,
    now: float | None = None,
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> tuple[EnqueueParams, ...]:
    """Every follow-up of ``outcome``: the ``then=`` continuation and the webhook delivery.

    When ``task`` is the claimed copy (a worker's outcome), ``retried`` is its attempt count
    after the outcome and ``now`` the outcome's time (the webhook event reports both). A
    malformed header costs only its own follow-up (logged), never the other or the outcome."""
    out: list[EnqueueParams] = []
    # Stored headers are data: whatever decoding one raises loses only that follow-up.
    if HEADER in task.headers:
        try:
            out.extend(build(task, outcome, result=result, error=error, max_payload=max_payload))
        except Exception as exc:
            log.error("task %s: no follow-up: %s", task.id, exc, extra=_extra(task))
    if webhooks.HEADER_URL in task.headers:
        done = now is not None and outcome == COMPLETED
        try:
            hook = webhooks.delivery(
                task,
                outcome,
                result=result,
                error=error,
                retried=retried,
                completed_at=datetime.fromtimestamp(now, UTC) if done and now else None,
                max_payload=max_payload,
            )
        except Exception as exc:
            log.error("task %s: no webhook delivery: %s", task.id, exc, extra=_extra(task))
        else:
            if hook is not None:
                out.append(hook)
    return tuple(out)


def for_archived(task: TaskInfo) -> tuple[EnqueueParams, ...]:
    """Follow-ups (continuation, webhook delivery) of a task archived outside a worker
    (rescuer, inspector); a malformed header gives none rather than blocking the archive."""
    if not wanted(task):
        return ()
    return follow_ups(task, ARCHIVED, error=task.last_error or "archived")


def _extra(task: TaskInfo) -> dict[str, Any]:
    return {"task_id": task.id, "task_type": task.type, "queue": task.queue}


def json_or_none(raw: bytes | None) -> Any:
    """Stored JSON decoded; ``None`` for none or for undecodable data."""
    if raw is None:
        return None
    try:
        return codec.decode(raw)
    except ValueError:
        return None  # undecodable stored data: the follow-up still learns of the outcome


def _encode(body: dict[str, Any], max_payload: int) -> bytes:
    omitted: list[str] = []
    for drop in (None, "result", "payload"):
        if drop is not None and drop in body:
            body[drop] = None
            omitted.append(drop)
            body["omitted"] = omitted
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        if len(raw) <= max_payload:
            return raw
    return raw  # the envelope alone: small whatever the task held
