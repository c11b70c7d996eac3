"""The Lua scripts of ``scripts/``: read once, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each operation is one file; the helpers of ``_lib.lua`` it uses, directly or through other
helpers, are prepended at load time. Every call of a script runs its whole chunk, which
creates each prepended helper again (a closure per function): the whole of ``_lib.lua``
cost about 2.5 µs of Redis CPU per call, a seventh of an enqueue script (16.8 against
14.4 µs per enqueue.lua call with only its helpers; INFO commandstats, min of 12 rounds of
5,000 pipelined calls on Redis 7.0). Redis 7's Functions (``FUNCTION LOAD`` once, then
``FCALL``) measured 13.9 µs: 0.5 µs less again, not worth a second way of calling scripts
beside the EVALSHA that Redis 6.2 and the cluster client need.
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

# A top-level definition of _lib.lua: `local function name(` or `local NAME =`.
_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--[^\n]*")


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One operation's source (with the helpers it uses) and its SHA1."""

    name: str
    source: bytes
    sha: str


def _read(name: str) -> str:
    return (resources.files("durq.brokers.redis") / "scripts" / f"{name}.lua").read_text("utf-8")


def _helpers(lib: str) -> tuple[str, dict[str, str]]:
    """``_lib.lua`` as its leading comment and its definitions by name, each running to the
    next definition (the comments above a helper travel with the one before it)."""
    starts = [(m.start(), m.group(1)) for m in _DEFINITION.finditer(lib)]
    ends = [start for start, _ in starts[1:]] + [len(lib)]
    head = lib[: starts[0][0]] if starts else lib
    return head, {name: lib[start:end] for (start, name), end in zip(starts, ends, strict=True)}


def link(body: str, lib: str) -> str:
    """``body`` with the definitions of ``lib`` it uses, directly or through each other, in
    their order in ``lib``."""
    head, blocks = _helpers(lib)
    used: set[str] = set()
    todo = [body]
    while todo:
        for word in set(_WORD.findall(_COMMENT.sub("", todo.pop()))):
            if word in blocks and word not in used:
                used.add(word)
                todo.append(blocks[word])
    kept = [block for name, block in blocks.items() if name in used]
    return "".join([head, *kept, "\n", body])


@cache
def load_scripts() -> dict[str, LuaScript]:
    """Every script by name, read from the package once per process."""
    lib = _read("_lib")
    out: dict[str, LuaScript] = {}
    for name in SCRIPT_NAMES:
        source = link(_read(name), lib).encode()
        out[name] = LuaScript(name, source, hashlib.sha1(source, usedforsecurity=False).hexdigest())
    return out
