"""Dependencies between tasks (``enqueue(..., after=[...])``), as brokers store them.

A task that waits for others is stored ``waiting`` with ``waiting_for``, the number of its
dependencies that had not finished when it was created. Each of those dependencies lists it
in its own ``dependents`` (a JSON array of ``[queue, id]``), written in the same atomic step as
the waiting task; a dependency that has finished (completed, archived) or is gone counts as
done at once and is not written to.

The step that finishes a dependency (completed, archived, cancelled, or deleted before it
finished) reads its ``dependents`` in that same transaction or script and counts each one
down (:func:`countdown`); a waiting task counted to zero is released (:func:`released`,
pending or scheduled at its own due time) and its queue's workers are woken. The list lives
on the dependency's own row, which the finishing step locks anyway: a dependent registered
concurrently is either seen there or saw the dependency finished. An archived task that the
inspector runs again starts with no dependents, so no dependent is counted twice.

A workflow (``enqueue_graph``) is created whole in one atomic step: its items come in an
order where each item's ``after`` names earlier items of the same call (:func:`graph_edges`),
so every dependency exists and is unfinished when its dependent is written, and the
dependent waits for all of them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durq.brokers.params import EnqueueParams

from durq.states import FINISHED, TaskState, released

#: How many tasks one task may wait for.
MAX_AFTER = 1000

__all__ = [
    "MAX_AFTER",
    "countdown",
    "decode",
    "graph_edges",
    "left_after",
    "released",
    "unfinished",
]


def unfinished(state: str | TaskState | None) -> bool:
    """Whether a dependency in ``state`` (``None``: gone) still holds its dependents."""
    return state is not None and TaskState(state) not in FINISHED


def decode(raw: str | bytes | None) -> list[tuple[str, str]]:
    """The ``[queue, id]`` pairs of a stored ``dependents`` value (``None``: none)."""
    if not raw:
        return []
    return [(str(q), str(i)) for q, i in json.loads(raw)]


def countdown(lists: Iterable[str | bytes | None]) -> Counter[tuple[str, str]]:
    """How many of its dependencies finished, per dependent, from the finished tasks'
    ``dependents`` (a task finishing two dependencies of one dependent counts it twice)."""
    counts: Counter[tuple[str, str]] = Counter()
    for raw in lists:
        counts.update(decode(raw))
    return counts


def left_after(waiting_for: int, finished: int) -> int:
    """Dependencies still unfinished once ``finished`` more finished."""
    return max(0, waiting_for - finished)


def graph_edges(items: Sequence[EnqueueParams]) -> list[tuple[int, ...]]:
    """Per item of an ``enqueue_graph`` call, the indexes of the earlier items its ``after``
    names (each once, in the order given); ValueError when it names anything else."""
    index: dict[tuple[str, str], int] = {}
    edges: list[tuple[int, ...]] = []
    for i, p in enumerate(items):
        found: dict[int, None] = {}
        for key in p.after:
            j = index.get(key)
            if j is None:
                raise ValueError(
                    f"task {p.id!r} waits for {key[1]!r} in {key[0]!r}, which is no earlier "
                    "task of this graph"
                )
            found[j] = None
        edges.append(tuple(found))
        index.setdefault((p.queue, p.id), i)
    return edges
