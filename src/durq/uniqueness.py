"""Deduplication users shape: :class:`Unique` picks which payload fields make two tasks
twins, buckets them by time, and says what an enqueue of a twin does.

It is decided here, at enqueue, as a key and a time the key holds; the broker stores both
with the task and refuses a twin atomically with the insert, as it does for ``unique=ttl``
(contract rule E4): the key holds until the task finishes (completed or archived) or its
time passes, whichever comes first.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from durq import codec, durations
from durq.durations import Duration
from durq.errors import PayloadError, ValidationError
from durq.states import TaskState
from durq.task import TaskInfo

#: What an enqueue of a twin does: raise :class:`~durq.DuplicateTaskError`, return the twin
#: that holds the key, or replace a waiting twin's payload (and a scheduled one's delay and
#: priority) in place; the web helpers answer ``200 already_accepted`` whatever it is.
OnConflict = Literal["raise", "return", "replace"]

#: The states a twin may block in: every state of a task that has not finished.
UNFINISHED: tuple[TaskState, ...] = (
    TaskState.PENDING,
    TaskState.SCHEDULED,
    TaskState.ACTIVE,
    TaskState.RETRY,
    TaskState.WAITING,
)

#: How long a key without ``ttl`` or ``period`` holds at most: until its task finishes, in
#: practice (a stored moment must be finite).
UNTIL_FINISHED = durations.MAX_DURATION

_MAX_PATH = 200

#: The header a debounced task is stored with: ``"<wait>,<max_wait>"`` in seconds
#: (``max_wait`` empty when none), so that the inspector can tell when it runs at the latest.
DEBOUNCE_HEADER = "durq-debounce"


@dataclass(frozen=True)
class Unique:
    """Two tasks are twins when they have the same queue, type and the same values at
    ``keys`` (dotted payload paths, ``"account.id"``; a missing field counts as ``null``;
    no keys: the whole payload). While one twin has not finished, another is refused.

    ``period`` (``"1h"``, seconds) buckets enqueues by time, aligned to the epoch: twins
    in different buckets do not meet, and a key holds at most to its bucket's end. ``ttl``
    bounds how long a key holds (``unique=ttl`` is the short form of ``Unique(ttl=ttl)``
    over the whole payload). ``on_conflict="return"`` makes ``app.enqueue`` return the
    twin that holds the key instead of raising :class:`~durq.DuplicateTaskError`;
    ``"replace"`` gives a twin that has not started the new payload (and, when it is
    scheduled, this enqueue's delay and priority) and returns it; a running twin is never
    changed, and the enqueue then raises.

    ``states``: while in which states a twin blocks (default: every state before it
    finishes). ``("pending", "scheduled", "retry")`` lets a new twin in once the first has
    started: "one sync queued per account, while another may run"."""

    keys: Sequence[str] | None = None
    period: Duration | None = None
    ttl: Duration | None = None
    on_conflict: OnConflict = "raise"
    states: Sequence[TaskState | str] = UNFINISHED
    #: Set by :class:`Debounce`: ``(wait, max_wait)`` seconds.
    debounce: tuple[float, float | None] | None = field(default=None, repr=False)
    #: Worked out once from the fields above: ``keys`` split at their dots, whether the
    #: payload's own values may be read at them (:func:`_given_values`), and ``ttl`` and
    #: ``period`` in seconds.
    _paths: tuple[tuple[str, ...], ...] = field(default=(), init=False, repr=False, compare=False)
    _given_paths: bool = field(default=False, init=False, repr=False, compare=False)
    _ttl: float | None = field(default=None, init=False, repr=False, compare=False)
    _period: float | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.keys, str):
            raise ValidationError("Unique(keys=...) takes a list of field paths, not one string")
        if self.keys is not None:
            keys = tuple(self.keys)
            for path in keys:
                if not isinstance(path, str) or not path or len(path) > _MAX_PATH:
                    raise ValidationError(f"invalid unique key path {path!r}")
                if any(not part for part in path.split(".")):
                    raise ValidationError(f"invalid unique key path {path!r} (empty part)")
            if len(set(keys)) != len(keys):
                raise ValidationError(f"unique key paths repeat: {list(keys)!r}")
            object.__setattr__(self, "keys", keys)
            paths = tuple(tuple(p.split(".")) for p in keys)
            object.__setattr__(self, "_paths", paths)
            object.__setattr__(self, "_given_paths", all(map(_plain_path, paths)))
        for name in ("period", "ttl"):
            value = durations.seconds(getattr(self, name))
            if value is not None and value <= 0:
                raise ValidationError(f"Unique({name}=...) must be > 0, got {value!r}")
            object.__setattr__(self, name, value)
            object.__setattr__(self, f"_{name}", value)
        if self.on_conflict not in ("raise", "return", "replace"):
            raise ValidationError(
                "Unique(on_conflict=...) is 'raise', 'return' or 'replace', "
                f"not {self.on_conflict!r}"
            )
        if isinstance(self.states, str):
            raise ValidationError("Unique(states=...) takes a list of states, not one string")
        try:
            states = tuple(dict.fromkeys(TaskState(s) for s in self.states))
        except (TypeError, ValueError):
            raise ValidationError(f"invalid Unique(states={self.states!r})") from None
        if not states or any(s not in UNFINISHED for s in states):
            raise ValidationError(
                "Unique(states=...) lists some of pending, scheduled, active, retry and "
                f"waiting (a finished task never blocks its twin), not {self.states!r}"
            )
        object.__setattr__(self, "states", tuple(s for s in UNFINISHED if s in states))

    @property
    def released_in(self) -> tuple[TaskState, ...]:
        """The unfinished states in which a twin no longer blocks (its key may go)."""
        return tuple(s for s in UNFINISHED if s not in self.states)

    def key(
        self, queue: str, task_type: str, payload: bytes, now: float, given: Any = None
    ) -> tuple[str, float]:
        """``(key, seconds it holds)`` for a task enqueued at ``now``: ``payload`` as encoded,
        and ``given``, the data it was encoded from if the caller has it."""
        ttl, period = self._ttl, self._period
        holds = UNTIL_FINISHED if ttl is None else ttl
        if self.keys is None and period is None:
            return codec.unique_key(queue, task_type, payload), holds
        picked = _given_values(given, self._paths) if self._given_paths else None
        if picked is None:
            try:
                data = codec.decode(payload)
            except (ValueError, RecursionError):
                raise PayloadError(
                    "payload is nested too deeply to compare for uniqueness"
                ) from None
            picked = data if self.keys is None else [_at(data, path) for path in self._paths]
        # One text encoded once: the same bytes as the UTF-8 of each part joined by NULs.
        text = "\x00".join(("scoped", queue, task_type, codec.canonical_text(picked)))
        if period is not None:
            bucket = math.floor(now / period)
            text += "\x00" + repr(bucket)
            holds = min(holds, (bucket + 1) * period - now)
        return hashlib.sha256(text.encode()).hexdigest(), holds if holds > 1e-3 else 1e-3


def Debounce(  # named like the option it makes, as durq.Unique
    key: str | Sequence[str],
    *,
    wait: Duration,
    max_wait: Duration | None = None,
) -> Unique:
    """Collapse enqueues of twins (same queue, type and ``key``, one or several dotted
    payload paths) into one task that runs ``wait`` after the last of them, with the latest
    payload, and no later than ``max_wait`` after the first. Give it as ``unique=``.

    A twin that has started no longer collects: the next enqueue makes a new task, so an
    edit that comes while the task runs is not lost."""
    keys = [key] if isinstance(key, str) else list(key)
    pause = durations.seconds(wait)
    if pause is None or pause <= 0:
        raise ValidationError(f"Debounce(wait=...) must be > 0, got {wait!r}")
    cap = durations.seconds(max_wait)
    if cap is not None and cap < pause:
        raise ValidationError(f"Debounce(max_wait=...) must be at least wait ({pause} s)")
    return Unique(
        keys=keys,
        on_conflict="replace",
        states=(TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY),
        debounce=(pause, cap),
    )


def debounce_header(debounce: tuple[float, float | None]) -> str:
    """The value of :data:`DEBOUNCE_HEADER` for ``Unique.debounce``."""
    wait, cap = debounce
    return f"{wait!r},{'' if cap is None else repr(cap)}"


def debounce_of(headers: dict[str, str]) -> tuple[float, float | None] | None:
    """``(wait, max_wait)`` of a task stored with :data:`DEBOUNCE_HEADER`, else ``None``."""
    raw = headers.get(DEBOUNCE_HEADER)
    if raw is None:
        return None
    wait, _, cap = raw.partition(",")
    try:
        return float(wait), float(cap) if cap else None
    except ValueError:
        return None  # not written by durq: shown as a plain unique key


@dataclass(frozen=True, slots=True)
class UniqueEntry:
    """A unique key held now and its task, as the inspector shows it."""

    key: str
    task_id: str
    type: str
    state: TaskState
    #: When the task is due (a debounced task: when it runs, unless a twin moves it).
    due: datetime | None
    #: Until when it holds the key at the latest; ``None``: until it finishes.
    until: datetime | None
    #: ``durq.Debounce``'s ``wait`` and ``max_wait`` (seconds), ``None`` for other keys.
    wait: float | None = None
    max_wait: float | None = None
    #: The latest a debounced task runs, however many twins move it (its enqueue time and
    #: ``max_wait``); ``None`` without ``max_wait``.
    latest: datetime | None = None

    @property
    def debounced(self) -> bool:
        return self.wait is not None

    @classmethod
    def of(cls, key: str, task: TaskInfo) -> UniqueEntry:
        """The entry of ``task`` holding ``key``; its debounce read from its header."""
        debounce = debounce_of(task.headers)
        wait, cap = debounce if debounce is not None else (None, None)
        latest, until, since = None, task.unique_until, task.enqueued_at
        if cap is not None and since is not None:
            latest = since + timedelta(seconds=cap)
        if until is not None and since is not None:
            if (until - since).total_seconds() >= UNTIL_FINISHED / 2:
                until = None  # held "until it finishes" is stored as a century ahead
        return cls(
            key, task.id, task.type, task.state, task.next_process_at, until, wait, cap, latest
        )

    def to_dict(self) -> dict[str, Any]:
        def iso(moment: datetime | None) -> str | None:
            return None if moment is None else moment.isoformat()

        return {
            "key": self.key,
            "task_id": self.task_id,
            "type": self.type,
            "state": self.state.value,
            "due": iso(self.due),
            "until": iso(self.until),
            "debounced": self.debounced,
            "wait": self.wait,
            "max_wait": self.max_wait,
            "latest": iso(self.latest),
        }


#: Types whose value JSON gives back as it was, with the same canonical text.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain_path(path: tuple[str, ...]) -> bool:
    """Whether no part of ``path`` is a name a non-string dict key encodes to (``true``,
    ``false``, ``null``, a number): then a dict of the payload as given and the object its
    JSON decodes to have the same value at each part (two keys cannot meet in one name)."""
    return not any(p in ("true", "false", "null") or p[0] in "-0123456789" for p in path)


def _given_values(given: Any, paths: tuple[tuple[str, ...], ...]) -> list[Any] | None:
    """The values at ``paths`` of the payload as given, when they are exactly what its
    decoded JSON holds there: each step a plain ``dict`` and each value a ``str``, ``int``,
    ``float``, ``bool`` or ``None`` of that very type (a subclass, a list, a model: ``None``,
    and the caller decodes). Skips decoding the encoded payload, about 7k of a ``Unique``
    enqueue's 30k instructions (counted)."""
    values = []
    for path in paths:
        data = given
        for part in path:
            if type(data) is not dict:
                return None
            data = data.get(part)
        if type(data) not in _SCALARS:
            return None
        values.append(data)
    return values


def _at(data: Any, path: tuple[str, ...]) -> Any:
    """The value at a dotted path (split at its dots) of the payload, ``None`` where it is
    missing."""
    for part in path:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


def as_unique(value: Duration | Unique | None, what: str = "unique") -> Unique | None:
    """``unique=`` as given: a ttl (the short form) or a :class:`Unique`; ``None``: none."""
    if value is None or isinstance(value, Unique):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str | timedelta):
        raise ValidationError(f"{what}: a ttl or durq.Unique(...), not {value!r}")
    ttl = durations.seconds(value)
    return None if not ttl else Unique(ttl=ttl)
