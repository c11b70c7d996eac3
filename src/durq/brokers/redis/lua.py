"""The Lua scripts of ``scripts/``: read once, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each operation is one file, with the whole of ``_lib.lua`` (the shared helpers) in front.
Every call runs the whole chunk and so defines every helper again; carrying only the helpers
a script uses saved about 11k of an ``enqueue.lua`` call's 134k Redis instructions, but
1.7 % of a task's Redis instructions over its life (the scale model's Redis estimate) and
less of any ``make bench`` figure, under the 3 % a speed-up must pay (docs/brokers/redis.md).

The scripts of :data:`LINKED` are the exception: they carry only the helpers they name
(directly or through each other). ``enqueue_plain.lua`` is the single enqueue of a web
handler, where all of ``_lib.lua`` cost 33.5k of a 151k-instruction ``enqueue.lua`` call
(callgrind of a private redis-server; docs/benchmarks.md, "The single enqueue").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

#: One script per state change; the file name without ``.lua``.
SCRIPT_NAMES = (
    "enqueue",
    "enqueue_plain",
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

#: Scripts that carry only the helpers of ``_lib.lua`` they use, not all of it.
LINKED = frozenset({"enqueue_plain"})

# A top-level definition of _lib.lua: `local function name(` or `local NAME =`.
_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--[^\n]*")


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One operation's source (``_lib.lua`` and the operation) and its SHA1."""

    name: str
    source: bytes
    sha: str


def _read(name: str) -> str:
    return (resources.files("durq.brokers.redis") / "scripts" / f"{name}.lua").read_text("utf-8")


def link(body: str, lib: str) -> str:
    """``body`` after the definitions of ``lib`` it uses, directly or through each other,
    in their order in ``lib`` (each definition runs to the next one)."""
    starts = [(m.start(), m.group(1)) for m in _DEFINITION.finditer(lib)]
    ends = [start for start, _ in starts[1:]] + [len(lib)]
    blocks = {name: lib[start:end] for (start, name), end in zip(starts, ends, strict=True)}
    used: set[str] = set()
    todo = [body]
    while todo:
        for word in set(_WORD.findall(_COMMENT.sub("", todo.pop()))):
            if word in blocks and word not in used:
                used.add(word)
                todo.append(blocks[word])
    return "".join([*(block for name, block in blocks.items() if name in used), "\n", body])


@cache
def load_scripts() -> dict[str, LuaScript]:
    """Every script by name, read from the package once per process."""
    lib = _read("_lib")
    out: dict[str, LuaScript] = {}
    for name in SCRIPT_NAMES:
        body = _read(name)
        source = (link(body, lib) if name in LINKED else f"{lib}\n{body}").encode()
        out[name] = LuaScript(name, source, hashlib.sha1(source, usedforsecurity=False).hexdigest())
    return out
