"""Groups: N tasks created together, and one follow-up when the last of them finishes.

``await app.enqueue_group([EnqueueRequest(...), ...], then=durq.Then("report:merge"))``
creates the members and the follow-up atomically (all or none) and records the group beside
them. The follow-up is ``waiting`` until the group's last member finished, so ``app.wait`` on
its id works from the start. Each member's header ``durq-group`` names its group. When a
member finishes (completed, or archived: retries used up, SkipRetry, cancelled, worker lost),
the move that records the outcome also records the member's entry in the group and counts it;
the move that counts the last member writes the follow-up's payload and releases it, in the
same transaction or script, so it runs exactly once whichever workers finish the members and
whichever of them crash.

A member deleted before it finished counts as finished with state ``"deleted"`` (no result),
so deleting a stuck member releases the group. Only a member's first final outcome counts:
an archived member run again from the inspector does not change the group.

The follow-up's id is ``group:<group id>``; its payload::

    {"group": {"id", "queue", "size"},
     "members": [{"id", "queue", "type", "state", "result"}, ...]}   # group order

with ``"error"`` in place of ``"result"`` for an archived member and neither for a deleted one.
The members' outcomes live in the group's record, so the follow-up is complete even when the
members were deleted on completion (``retention=0``). Each member has an equal share of the
payload limit (at least 256 bytes); an entry over its share loses its result
(``"omitted": ["result"]``), which the follow-up can read from the member while it is
retained. The entries keep the members' names, so the follow-up of a big group can exceed
the payload limit: :func:`payload_limit` is what a worker accepts for it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from durq import codec, continuations, names
from durq.brokers.base import EnqueueParams, GroupParams, MemberOutcome
from durq.errors import ValidationError

if TYPE_CHECKING:
    from durq.task import TaskInfo

#: Header of a member task: ``{"id": <group id>, "queue": <group queue>, "size": N}``.
HEADER = "durq-group"
#: Header of the follow-up naming the group it fans in: ``{"id": <group id>, "queue": ...}``.
FOLLOWS_HEADER = "durq-follows-group"
#: How long a finished group's record is kept by default (seconds).
DEFAULT_RETENTION = 86400.0
#: Largest group; a bigger fan-in is a group of groups.
MAX_MEMBERS = 10_000
#: The smallest share of the payload limit a member's entry gets.
MIN_SHARE = 256
COMPLETED, ARCHIVED, DELETED = "completed", "archived", "deleted"


@dataclass(frozen=True, slots=True)
class Group:
    """What :meth:`durq.App.enqueue_group` created: the group's id and queue (together they
    name it to the inspector), its member tasks in order, and its follow-up's task id."""

    id: str
    queue: str
    tasks: tuple[TaskInfo, ...]
    then_id: str | None


def check_id(group_id: str) -> str:
    """A group id: 1-100 letters, digits, ``_`` or ``-`` (it is part of storage keys);
    InvalidNameError otherwise."""
    return names.check_group_id(group_id)


def follow_up_id(group_id: str) -> str:
    """``group:<group id>``: one follow-up per group."""
    return f"group:{group_id}"


def of(task: TaskInfo, header: str = HEADER) -> tuple[str, str] | None:
    """``(group id, group queue)`` of a member task (of the group a follow-up fans in, with
    ``header=FOLLOWS_HEADER``), or ``None``."""
    raw = task.headers.get(header)
    if raw is None:
        return None
    try:
        spec = json.loads(raw)
        return check_id(spec["id"]), names.check_queue(spec["queue"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed {HEADER} header: {raw!r}") from exc


def member_of(task: TaskInfo) -> tuple[str, str] | None:
    """``(group id, group queue)`` of a member task; ``None`` for any other task (or an
    unreadable header)."""
    try:
        return of(task)
    except ValueError:
        return None


def followed_by(task: TaskInfo) -> tuple[str, str] | None:
    """``(group id, group queue)`` of the group whose follow-up ``task`` is, or ``None``."""
    try:
        return of(task, FOLLOWS_HEADER)
    except ValueError:
        return None


def build(
    group_id: str,
    members: Sequence[EnqueueParams],
    then: continuations.Then | str | None,
    app: Any,
    *,
    retention: float,
    max_payload: int,
) -> GroupParams:
    """The :class:`GroupParams` of validated members (``app.params`` of each request)."""
    if not members:
        raise ValidationError("a group needs at least one member")
    if len(members) > MAX_MEMBERS:
        raise ValidationError(f"a group has at most {MAX_MEMBERS} members, not {len(members)}")
    if retention < 0:
        raise ValidationError("group retention must be >= 0")
    if any(p.after for p in members):
        # The members are created together and run together: the group waits for nothing.
        raise ValidationError("a group member cannot wait for other tasks (after=)")
    check_id(group_id)
    queue = members[0].queue
    header = json.dumps(
        {"id": group_id, "queue": queue, "size": len(members)},
        separators=(",", ":"),
        sort_keys=True,
    )
    tagged = tuple(replace(p, headers={**p.headers, HEADER: header}) for p in members)
    seen: set[tuple[str, str]] = set()
    for p in tagged:
        if (p.queue, p.id) in seen:
            raise ValidationError(f"task {p.id!r} appears twice in the group")
        seen.add((p.queue, p.id))
    follow_up: EnqueueParams | None = None
    tail = b""
    if then is not None:
        spec = json.loads(continuations.resolve(then, queue, app))
        head = json.dumps(
            {"group": {"id": group_id, "queue": queue, "size": len(members)}},
            separators=(",", ":"),
        )
        # The members' entries are appended by the broker: '{"group":{...},"members":[' + ... + ']}'
        follow_up = EnqueueParams(
            id=follow_up_id(group_id),
            queue=names.check_queue(spec["queue"]),
            type=names.check_type(spec["type"]),
            payload=(head[:-1] + ',"members":[').encode(),
            max_retry=int(spec["max_retry"]),
            timeout=spec.get("timeout"),
            retention=float(spec.get("retention") or 0.0),
            headers={FOLLOWS_HEADER: header},
        )
        tail = b"]}"
    return GroupParams(
        id=group_id,
        queue=queue,
        members=tagged,
        unfinished=tuple(
            _entry(p.id, p.queue, p.type, DELETED, None, budget=max_payload) for p in tagged
        ),
        then=follow_up,
        tail=tail,
        retention=float(retention),
    )


def outcome(
    task: TaskInfo,
    state: str,
    *,
    result: bytes | None = None,
    error: str | None = None,
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> MemberOutcome | None:
    """The :class:`MemberOutcome` of ``task`` finishing in ``state``; ``None`` for a task
    that is no group member (or whose header is unreadable: the outcome still happens)."""
    if HEADER not in task.headers:
        return None
    try:
        found = of(task)
    except ValueError:
        return None
    assert found is not None
    group_id, group_queue = found
    budget = _budget(task, max_payload)
    value = continuations.json_or_none(result) if state == COMPLETED else error
    return MemberOutcome(
        group=group_id,
        group_queue=group_queue,
        state=state,
        entry=_entry(task.id, task.queue, task.type, state, value, budget=budget),
    )


def _size(task: TaskInfo, header: str) -> int:
    """The group size that ``task``'s ``header`` names (1 when unreadable), at most
    :data:`MAX_MEMBERS`."""
    try:
        size = int(json.loads(task.headers.get(header, "")).get("size", 1))
    except (ValueError, AttributeError, TypeError):
        return 1
    return min(max(1, size), MAX_MEMBERS)


def _budget(task: TaskInfo, max_payload: int) -> int:
    """Each member's share of the follow-up's payload limit (at least 256 bytes, so that a
    small result survives in a big group)."""
    return max(MIN_SHARE, max_payload // _size(task, HEADER) - 1)


def _entry(task_id: str, queue: str, type: str, state: str, value: Any, *, budget: int) -> bytes:
    body: dict[str, Any] = {"id": task_id, "queue": queue, "type": type, "state": state}
    if state == COMPLETED:
        body["result"] = value
    elif state == ARCHIVED:
        body["error"] = value
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if len(raw) <= budget:
        return raw
    key = "result" if state == COMPLETED else "error"
    body[key] = None
    body["omitted"] = [key]
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


#: The longest entry a member can have once its result is left out: the longest names
#: (ASCII, so one byte a character).
_NAMES_MAX = len(
    _entry(
        "i" * names.TASK_ID_MAX,
        "q" * names.NAME_MAX,
        "t" * names.NAME_MAX,
        COMPLETED,
        0,
        budget=0,
    )
)


def payload_limit(task: TaskInfo, max_payload: int) -> int:
    """The largest payload a worker decodes for ``task``: ``max_payload``, or more for the
    follow-up of a group. Its entries fit the members' shares of ``max_payload``, except
    that a share is at least 256 bytes and an entry keeps its names however long they are:
    at most ``max_payload`` and 486 bytes a member (under 6 MB for 10,000 members and the
    default limit)."""
    if FOLLOWS_HEADER not in task.headers:
        return max_payload
    # The head ('{"group":{...},"members":[' with a group id and queue of at most 100
    # characters) and the tail take less than 1 KiB; a comma between entries.
    return max_payload + _size(task, FOLLOWS_HEADER) * (_NAMES_MAX + 1) + 1024
