"""The Lua scripts of ``scripts/``: read once, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each operation is one file, with the helpers of ``_lib.lua`` prepended at load time. Every
call of a script runs its whole chunk, so the helpers are defined on each call: about 3 µs of
Redis CPU per call (INFO commandstats, an EVALSHA of the helpers alone), against the 150-250 µs
of worker CPU a task costs (benchmarks/cpu_per_task.py): prepending only the helpers a script
uses would not be worth a linker.
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
    "claim",
    "extend",
    "complete",
    "retry",
    "archive",
    "requeue",
    "promote",
    "expired",
    "janitor",
    "admin_move",
    "oldest_pending",
    "admin_cancel",
    "admin_run_all",
    "admin_delete_all",
)


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One operation's source (with the shared helpers) and its SHA1."""

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
