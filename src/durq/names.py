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
#: The patterns, for documents that describe valid names (the admin API's OpenAPI).
NAME_PATTERN = _NAME.pattern
TASK_ID_PATTERN = _TASK_ID.pattern
GROUP_ID_PATTERN = _GROUP_ID.pattern


def check_queue(name: str) -> str:
    """Return a valid queue name or raise :class:`InvalidNameError`."""
    return _check(name, "queue name", _NAME, NAME_MAX)


def check_type(name: str) -> str:
    """Return a valid task type or raise :class:`InvalidNameError`."""
    return _check(name, "task type", _NAME, NAME_MAX)


def check_task_id(task_id: str) -> str:
    """Return a valid task id or raise :class:`InvalidNameError`."""
    return _check(task_id, "task id", _TASK_ID, TASK_ID_MAX)


def check_group_id(group_id: str) -> str:
    """Return a valid group id (letters, digits, ``_``, ``-``) or raise InvalidNameError."""
    return _check(group_id, "group id", _GROUP_ID, NAME_MAX)


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
    return "_ . : -" if pattern is _NAME else "_ . : - @ + = /"
