"""The Lua scripts of ``scripts/``: read once, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each operation is one file; the helpers of ``_lib.lua`` it uses (directly or through another
helper) are prepended to it at load time. Only those: every call of a script runs its whole
chunk, and defining unused helpers cost a few microseconds per call on the server.
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


#: A top-level definition of _lib.lua: ``local function name(`` or ``local NAME =``.
_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)\b")


def _definitions(lib: str) -> list[tuple[str, str]]:
    """The top-level definitions of ``_lib.lua`` in order, each with its leading comment."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []  # comment lines waiting for the definition they describe
    for line in lib.splitlines(keepends=True):
        match = _DEFINITION.match(line)
        if match:
            out.append((match.group(1), "".join(pending) + line))
            pending = []
        elif out and not line.startswith("--") and line.strip() and not pending:
            name, text = out[-1]
            out[-1] = (name, text + line)  # the body of the last definition
        elif line.startswith("--"):
            pending.append(line)
        elif out and not pending:
            name, text = out[-1]
            out[-1] = (name, text + line)
        else:
            pending = []  # a blank line ends a comment that belongs to no definition
    return out


def _uses(text: str, name: str) -> bool:
    code = re.sub(r"--[^\n]*", "", text)  # a name mentioned in a comment is not a use
    return re.search(rf"\b{re.escape(name)}\b", code) is not None


def with_helpers(lib: str, body: str) -> str:
    """``body`` with the helpers of ``lib`` it needs, transitively, in their lib order."""
    definitions = _definitions(lib)
    needed: set[str] = set()
    frontier = [body]
    while frontier:
        text = frontier.pop()
        for name, definition in definitions:
            if name not in needed and _uses(text, name):
                needed.add(name)
                frontier.append(definition)
    helpers = "".join(d for name, d in definitions if name in needed)
    return helpers + "\n" + body


@cache
def load_scripts() -> dict[str, LuaScript]:
    """Every script by name, read from the package once per process."""
    lib = _read("_lib")
    out: dict[str, LuaScript] = {}
    for name in SCRIPT_NAMES:
        source = with_helpers(lib, _read(name)).encode("utf-8")
        out[name] = LuaScript(name, source, hashlib.sha1(source, usedforsecurity=False).hexdigest())
    return out
