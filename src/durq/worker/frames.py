"""Tracebacks that start at the task's own code.

Between the worker and a handler sit the executor, the thread pool and asyncio (and, for a
Django task, the integration's wrapper): four or more frames above every task's own, the
same in every traceback and of no use to whoever reads it. Stored tracebacks and the
tracebacks in durq's log lines leave them out."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The executor, and the Django integration's wrapper (a path, not an import: the worker
#: knows no integration).
_OWN_FILES = frozenset(
    {
        os.path.join(_HERE, "executor.py"),
        os.path.join(os.path.dirname(_HERE), "contrib", "django", "execution.py"),
    }
)
_OWN_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (concurrent.futures.__file__ or "", asyncio.__file__ or "")
)


def is_machinery(filename: str) -> bool:
    """Whether a frame of ``filename`` is the worker's machinery, not the task's code."""
    path = os.path.abspath(filename)
    return path in _OWN_FILES or path.startswith(_OWN_DIRS)


def _drop(te: traceback.TracebackException, seen: set[int]) -> None:
    if id(te) in seen:  # a chain may loop back (an exception's context set by hand)
        return
    seen.add(id(te))
    kept = [frame for frame in te.stack if not is_machinery(frame.filename)]
    if kept:  # an error of the machinery itself keeps its frames
        te.stack = traceback.StackSummary.from_list(kept)
    for linked in (te.__cause__, te.__context__, *(te.exceptions or ())):
        if linked is not None:
            _drop(linked, seen)


def format_exception(exc: BaseException) -> str:
    """``traceback.format_exception(exc)`` without the machinery's frames, in every
    exception of the chain."""
    te = traceback.TracebackException.from_exception(exc)
    _drop(te, set())
    return "".join(te.format())
