"""Validation of queue names, task types and task ids: once at the edge (S3)."""

from __future__ import annotations

import re

from durq.errors import InvalidNameError

NAME_MAX = 100
TASK_ID_MAX = 200
# Letters, digits and a few separators; nothing that means something in SQL, Redis key
# patterns, shells or URLs.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")
_TASK_ID = re.compile(r"^[A-Za-z0-9_.:\-@+=/]+$")
# Group ids are parts of storage keys: no ":" (Redis derives a group's keys by suffix).
_GROUP_ID = re.compile(r"^[A-Za-z0-9_\-]+$")
# Workflow ids: a node's task id is "wf:<id>:<node>", so no ":" (nor "/").
_WORKFLOW_ID = re.compile(r"^[A-Za-z0-9_.\-@+=]+$")
#: A workflow id's length limit, so that ``wf:<id>:<node>`` fits a task id.
WORKFLOW_ID_MAX = 90
#: The patterns, for documents that describe valid names (the admin API's OpenAPI).
NAME_PATTERN = _NAME.pattern
TASK_ID_PATTERN = _TASK_ID.pattern
GROUP_ID_PATTERN = _GROUP_ID.pattern
WORKFLOW_ID_PATTERN = _WORKFLOW_ID.pattern


def check_queue(name: str) -> str:
    """Return a valid queue name or raise :class:`InvalidNameError`."""
    return _check(name, "queue name", _NAME, NAME_MAX)


def check_type(name: str) -> str:
    """Return a valid task type or raise :class:`InvalidNameError`."""
    return _check(name, "task type", _NAME, NAME_MAX)


#: The prefix of durq's own task types (``durq:webhook``): only durq creates such tasks.
RESERVED_TYPE_PREFIX = "durq:"


def check_enqueued_type(name: str) -> str:
    """Return a valid task type that a caller may enqueue, or raise
    :class:`InvalidNameError`: durq's own ``durq:`` types are refused, since their handlers
    trust their payload (the worker signs and POSTs a ``durq:webhook`` task's body). durq
    creates those tasks itself, as follow-ups built without this check."""
    check_type(name)
    if name.startswith(RESERVED_TYPE_PREFIX):
        raise InvalidNameError(
            f"task type {name!r} is reserved: durq creates its {RESERVED_TYPE_PREFIX!r} "
            "tasks itself"
        )
    return name


def check_node_name(name: str, what: str = "node name") -> str:
    """Return a valid workflow or node name (as a task type: letters, digits, ``_ . : -``)
    or raise :class:`InvalidNameError`."""
    return _check(name, what, _NAME, NAME_MAX)


def check_task_id(task_id: str) -> str:
    """Return a valid task id or raise :class:`InvalidNameError`."""
    return _check(task_id, "task id", _TASK_ID, TASK_ID_MAX)


def check_new_task_id(task_id: str) -> str:
    """Return a valid id for a new task or raise :class:`InvalidNameError`: as
    :func:`check_task_id`, and not ``.`` or ``..``, which a URL path (the dashboard's links,
    the admin API) reads as the current or parent folder, so the task's page could not be
    reached. Lookups keep :func:`check_task_id`: a task stored earlier stays reachable."""
    check_task_id(task_id)
    if task_id in (".", ".."):
        raise InvalidNameError(f"invalid task id {task_id!r}: '.' and '..' are path segments")
    return task_id


def check_group_id(group_id: str) -> str:
    """Return a valid group id (letters, digits, ``_``, ``-``) or raise InvalidNameError."""
    return _check(group_id, "group id", _GROUP_ID, NAME_MAX)


def check_workflow_id(workflow_id: str) -> str:
    """Return a valid workflow id (letters, digits, ``_ . - @ + =``, at most
    :data:`WORKFLOW_ID_MAX`) or raise InvalidNameError."""
    return _check(workflow_id, "workflow id", _WORKFLOW_ID, WORKFLOW_ID_MAX)


# Names seen valid before; queues and types repeat on every enqueue, so check each once.
_known: set[tuple[str, str]] = set()
_KNOWN_MAX = 10_000


def _check(value: object, what: str, pattern: re.Pattern[str], limit: int) -> str:
    if (what, value) in _known:
        return value  # type: ignore[return-value]
    if not isinstance(value, str) or not value:
        raise InvalidNameError(f"{what} must be a non-empty string")
    if len(value) > limit:
        raise InvalidNameError(f"{what} is longer than {limit} characters")
    if not pattern.fullmatch(value):
        raise InvalidNameError(
            f"invalid {what} {value!r}: use letters, digits and {_allowed(pattern)}"
        )
    if what in ("queue name", "task type") and len(_known) < _KNOWN_MAX:
        _known.add((what, value))
    return value


def _allowed(pattern: re.Pattern[str]) -> str:
    if pattern is _GROUP_ID:
        return "_ -"
    if pattern is _WORKFLOW_ID:
        return "_ . - @ + ="
    return "_ . : -" if pattern is _NAME else "_ . : - @ + = /"
