"""Every Redis key name durq uses, built here and nowhere else.

Layout (``P`` is the prefix, default ``durq``; ``Q`` a queue name)::

    P:schema                    string   storage layout version
    P:queues                    set      known queue names
    P:paused                    set      paused queue names (listing only; scripts read P:{Q}:paused)
    P:workers                   zset     worker id by last heartbeat (broker clock)
    P:worker:<worker id>        string   JSON WorkerInfo, with a TTL as garbage collection
    P:schedules                 hash     schedule name -> JSON of its stored record
    P:{Q}:t:<task id>           hash     one task
    P:{Q}:pending               zset     ready tasks by next_process_at (ties: enqueue order)
    P:{Q}:scheduled             zset     by next_process_at
    P:{Q}:retry                 zset     by next_process_at
    P:{Q}:active                zset     by lease expiry
    P:{Q}:completed             zset     by end of retention
    P:{Q}:archived              zset     by time archived
    P:{Q}:waiting               zset     tasks waiting for others (after=), by enqueue time,
                                         and for a signal, by the time they began waiting;
                                         scripts name it after a task hash (up to "}")
    P:{Q}:awaiting              zset     tasks waiting for a signal, by the end of their wait
    P:{Q}:paused                string   present while the queue is paused
    P:{Q}:seq                   string   enqueue counter (tie-break of the zsets)
    P:{Q}:unique                hash     unique key -> "<task id>|<expires at>"
    P:{Q}:stats                 hash     processed / failed totals
    P:{Q}:stats:<YYYY-MM-DD>    hash     processed / failed of one UTC day
    P:{Q}:outbox                hash     follow-ups into another slot, not yet created (cluster)
    P:{Q}:minutes:<YYYY-MM-DD>  hash     p:<minute> / f:<minute> of that day's minutes
    P:{Q}:notify                channel  pub/sub wake-ups; also a list: at most one wake-up token,
                                         taken by a worker blocked in BLPOP
    P:{Q}:g:<group id>          hash     a group whose first member is in Q: total, finished,
                                         retention, the follow-up's enqueue keys and arguments
    P:{Q}:g:<group id>:e        hash     position -> the member's entry in the follow-up
    P:{Q}:g:<group id>:s        hash     position -> the member's final state, once finished
    P:{Q}:w:<workflow id>       hash     a workflow whose first node is in Q: id, name, created_at,
                                         retention, nodes (JSON: [name, queue, task id, type,
                                         on_failure, [after...]] each)
    P:{Q}:workflows             zset     "<created_at %020.6f>:<workflow id>" of its workflows, all
                                         scores 0: newest first by ZREVRANGEBYLEX
    P:{Q}:workflows:due         zset     workflow id by when the janitor looks at it next
    P:{Q}:t:<task id>:end       channel  the task ended (scripts: KEYS[1] .. ':end'; not a key)
    P:{Q}:limits                hash     limit key -> its counter (running, token bucket)
    P:{Q}:held                  zset     "<limit key>\0<rank>\0<member>": pending tasks held on
                                         a key, in claim order (rank: the pending score)
    P:{Q}:limwait               set      limit keys with held tasks
    P:{Q}:fair                  zset     "<fair template>\0<band><turn>\0<member>" (score 0):
                                         pending tasks not held, each template's in turn
                                         order (W22; named by the scripts, from the pending key)
    P:{Q}:turns                 zset     "<template>\0<key>" -> a partition's last turn,
                                         "<template>\0" -> the template's round (W22)

Every key of one queue carries the hash tag ``{Q}``, so each script touches one slot. A group
member's task hash names its group's hash (field ``g``, the ``:e``/``:s`` keys are derived
from it in the scripts); a group whose members or follow-up live in other queues than its
first member makes scripts touch several slots: atomic on a single node; on a Redis Cluster
``enqueue_group`` refuses such a group. Queue
names, task ids and the prefix are checked here again (no braces, no glob characters, no
whitespace), so a name can never move a key into another queue's or another prefix's space.
"""

from __future__ import annotations

import re
from datetime import date
from functools import lru_cache

from durq.errors import ConfigurationError, InvalidNameError
from durq.names import check_group_id, check_queue, check_task_id, check_workflow_id

#: The prefix is also used as a glob by cleanup tools, so glob characters are refused.
_PREFIX = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
#: Worker ids are free-form (host names); unsafe characters are percent-escaped.
_WORKER_UNSAFE = re.compile(r"[^A-Za-z0-9_.:\-@+=/]")
#: Belt and braces on top of durq.names: these characters would change the hash tag or make a
#: key name match another key's pattern.
_FORBIDDEN = frozenset("{}*?[]\\ \t\r\n\x00")

DEFAULT_PREFIX = "durq"


def check_prefix(prefix: str) -> str:
    """Return a valid key prefix or raise :class:`ConfigurationError`."""
    if not _PREFIX.fullmatch(prefix):
        raise ConfigurationError(
            f"invalid Redis key prefix {prefix!r}: use 1-64 letters, digits, '_', '.' or '-'"
        )
    return prefix


def _safe(value: str, what: str) -> str:
    if _FORBIDDEN.intersection(value):
        raise InvalidNameError(f"invalid {what} {value!r}")
    return value


class QueueKeys:
    """The keys of one queue; all share the hash tag ``{queue}``."""

    __slots__ = (
        "active",
        "archived",
        "awaiting",
        "base",
        "completed",
        "held",
        "limit_waiting",
        "limits",
        "name",
        "notify",
        "outbox",
        "paused",
        "pending",
        "retry",
        "scheduled",
        "seq",
        "stats",
        "task_prefix",
        "unique",
        "waiting",
        "workflows",
        "workflows_due",
    )

    def __init__(self, prefix: str, queue: str) -> None:
        self.name = _safe(check_queue(queue), "queue name")
        self.base = f"{prefix}:{{{queue}}}"
        self.pending = f"{self.base}:pending"
        self.scheduled = f"{self.base}:scheduled"
        self.retry = f"{self.base}:retry"
        self.active = f"{self.base}:active"
        self.completed = f"{self.base}:completed"
        self.archived = f"{self.base}:archived"
        self.waiting = f"{self.base}:waiting"
        self.awaiting = f"{self.base}:awaiting"
        self.paused = f"{self.base}:paused"
        self.seq = f"{self.base}:seq"
        self.unique = f"{self.base}:unique"
        self.stats = f"{self.base}:stats"
        self.notify = f"{self.base}:notify"
        self.outbox = f"{self.base}:outbox"
        self.limits = f"{self.base}:limits"
        self.held = f"{self.base}:held"
        self.limit_waiting = f"{self.base}:limwait"
        self.workflows = f"{self.base}:workflows"
        self.workflows_due = f"{self.base}:workflows:due"
        #: Scripts that discover task ids in a zset build the task key from this (same slot).
        self.task_prefix = f"{self.base}:t:"

    def task(self, task_id: str) -> str:
        """The hash of one task."""
        # check_task_id's pattern already excludes every character _safe refuses.
        return self.task_prefix + check_task_id(task_id)

    def group(self, group_id: str) -> str:
        """The hash of one group; its entries and states are this key + ``:e`` / ``:s``
        (group ids hold no ``:``, so no two groups' keys can meet)."""
        return f"{self.base}:g:{check_group_id(group_id)}"

    def workflow(self, workflow_id: str) -> str:
        """The hash of one workflow's record (workflow ids hold no ``:``)."""
        return f"{self.base}:w:{_safe(check_workflow_id(workflow_id), 'workflow id')}"

    def end(self, task_id: str) -> str:
        """The channel where scripts announce that the task ended (completed, archived or
        deleted): its hash's name and ``:end``, so a script builds it from ``KEYS[1]``."""
        return self.task(task_id) + ":end"

    def stats_day(self, day: date) -> str:
        """The daily counter hash of ``day`` (its key ends in ``YYYY-MM-DD``)."""
        return f"{self.stats}:{day.isoformat()}"

    def minutes(self, day: date) -> str:
        """The per-minute counter hash of ``day``."""
        return f"{self.base}:minutes:{day.isoformat()}"

    def by_state(self, state: str) -> str:
        """The zset that indexes tasks of ``state``."""
        return {
            "pending": self.pending,
            "scheduled": self.scheduled,
            "retry": self.retry,
            "active": self.active,
            "completed": self.completed,
            "archived": self.archived,
            "waiting": self.waiting,
        }[state]


def queue_of_channel(channel: str) -> str:
    """The queue whose wake-up channel is ``channel`` (``P:{Q}:notify``)."""
    return channel[channel.index("{") + 1 : channel.rindex("}")]


class Keys:
    """Key names under one prefix."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = check_prefix(prefix)
        self.schema = f"{prefix}:schema"
        self.queues = f"{prefix}:queues"
        self.paused = f"{prefix}:paused"
        self.workers = f"{prefix}:workers"
        self.schedules = f"{prefix}:schedules"
        self._queue = lru_cache(maxsize=1024)(self._make_queue)

    def _make_queue(self, queue: str) -> QueueKeys:
        return QueueKeys(self.prefix, queue)

    def queue(self, queue: str) -> QueueKeys:
        """The keys of ``queue`` (validated; cached)."""
        return self._queue(queue)

    def worker(self, worker_id: str) -> str:
        """The record of one worker process."""
        if not worker_id:
            raise InvalidNameError("worker id must be a non-empty string")
        escaped = _WORKER_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", worker_id)
        return f"{self.prefix}:worker:{escaped}"
