"""The Lua scripts of ``scripts/``: read once, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each operation is one file, with the whole of ``_lib.lua`` (the shared helpers) in front.
Every call runs the whole chunk and so defines every helper again; carrying only the helpers
a script uses saves about 11k of an ``enqueue.lua`` call's 134k Redis instructions, but
1.7 % of a task's Redis instructions over its life (the scale model's Redis estimate) and
less of any ``make bench`` figure, under the 3 % a speed-up must pay (docs/brokers/redis.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources

#: One script per state change; the file name without ``.lua``.
SCRIPT_NAMES = (
    "enqueue",
    "enqueue_many",
    "enqueue_group",
    "enqueue_after",
    "enqueue_graph",
    "claim",
    "extend",
    "complete",
    "retry",
    "archive",
    "requeue",
    "progress",
    "steps_read",
    "snoozes_read",
    "steps_record",
    "signal",
    "signals_read",
    "free_unique",
    "replace_twin",
    "promote",
    "expired",
    "janitor",
    "janitor_archived",
    "janitor_workflow",
    "admin_move",
    "oldest_pending",
    "unique_count",
    "fair_partitions",
    "admin_cancel",
    "admin_rewrite",
    "admin_run_all",
    "admin_delete_all",
    "admin_limit",
    "schedule_put",
)


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One operation's source (``_lib.lua`` and the operation) and its SHA1."""

    name: str
    source: bytes
    sha: str


def _read(name: str) -> str:
    return (resources.files("durq.brokers.redis") / "scripts" / f"{name}.lua").read_text("utf-8")


@cache
def load_scripts() -> dict[str, LuaScript]:
    """Every script by name, read from the package once per process."""
    lib = _read("_lib")
    out: dict[str, LuaScript] = {}
    for name in SCRIPT_NAMES:
        source = f"{lib}\n{_read(name)}".encode()
        out[name] = LuaScript(name, source, hashlib.sha1(source, usedforsecurity=False).hexdigest())
    return out
