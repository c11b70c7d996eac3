"""A workflow's progress, decided here once for every broker and every display.

A broker stores a workflow's record (:class:`~durq.brokers.views.WorkflowRecord`) and reads
its nodes' tasks with it; nothing on the completion path counts anything for a workflow.
:func:`progress` turns such a record into a :class:`WorkflowProgress`: each node's state, the
number of nodes in each state and the workflow's own state:

* ``cancelled``: a node was cancelled (``app.cancel_workflow``, ``durq workflow cancel``, or
  one task cancelled by hand);
* ``failed``: a node failed whose ``on_failure`` is ``cancel``, or did not run because of
  such a node (``app.wait`` on the workflow raises WorkflowFailedError then, even while other
  branches still run);
* ``running``: else, while a node has not finished;
* ``succeeded``: every node finished without either of the above (a node failed with
  ``skip`` or ``continue``, or skipped, does not fail the workflow; nor does a node whose task
  is gone, most often a result past its retention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from durq import lifecycle
from durq.brokers.views import WorkflowNodeInfo, WorkflowRecord
from durq.states import FINISHED, TaskState
from durq.workflows import NOT_RUN

WorkflowState = Literal["running", "succeeded", "failed", "cancelled"]
#: Every workflow state, in the order lists and filters show them.
WORKFLOW_STATES: tuple[WorkflowState, ...] = ("running", "succeeded", "failed", "cancelled")
#: A node's state when its task is gone (deleted, or completed past its retention).
GONE = "gone"

__all__ = [
    "GONE",
    "WORKFLOW_STATES",
    "WorkflowNodeProgress",
    "WorkflowProgress",
    "WorkflowState",
    "progress",
]


@dataclass(frozen=True, slots=True)
class WorkflowNodeProgress:
    """One node of a workflow as the inspector shows it."""

    name: str
    type: str
    queue: str
    task_id: str
    on_failure: str
    #: The names of the nodes it runs after.
    after: tuple[str, ...]
    #: Its task's state (a :class:`~durq.TaskState` value), or ``"gone"``.
    state: str
    #: Finished attempts: the failed ones and, once completed, the one that succeeded.
    attempts: int
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "queue": self.queue,
            "task_id": self.task_id,
            "on_failure": self.on_failure,
            "after": list(self.after),
            "state": self.state,
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True)
class WorkflowProgress:
    """A workflow as the inspector, the CLI, the admin API and the dashboard show it."""

    id: str
    name: str
    #: Epoch seconds on the broker's clock.
    created_at: float
    state: WorkflowState
    #: In the order they were created: each after the nodes it runs after.
    nodes: tuple[WorkflowNodeProgress, ...]

    @property
    def total(self) -> int:
        return len(self.nodes)

    @property
    def finished(self) -> int:
        """Nodes whose task finished (completed or archived) or is gone."""
        return sum(1 for n in self.nodes if n.state in _DONE)

    @property
    def by_state(self) -> dict[str, int]:
        """How many nodes are in each state (``gone`` for tasks no longer stored)."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.state] = counts.get(n.state, 0) + 1
        return counts

    def node(self, name: str) -> WorkflowNodeProgress:
        """One node by name (KeyError if none)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def to_dict(self, *, nodes: bool = True) -> dict[str, Any]:
        """The JSON form (``durq workflow get --json``, the admin API); ``nodes=False``
        leaves the nodes out (a listing)."""
        data: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at,
            "state": self.state,
            "total": self.total,
            "finished": self.finished,
            "by_state": self.by_state,
        }
        if nodes:
            data["nodes"] = [n.to_dict() for n in self.nodes]
        return data


_DONE = frozenset({*(s.value for s in FINISHED), GONE})


def progress(record: WorkflowRecord) -> WorkflowProgress:
    """The progress of a stored workflow (see the module's docstring)."""
    nodes = tuple(_node(n) for n in record.nodes)
    outcomes = {_outcome(n) for n in record.nodes}
    state: WorkflowState
    if "cancelled" in outcomes:
        state = "cancelled"
    elif "failed" in outcomes:
        state = "failed"
    elif "unfinished" in outcomes:
        state = "running"
    else:
        state = "succeeded"
    return WorkflowProgress(record.id, record.name, record.created_at, state, nodes)


def _node(n: WorkflowNodeInfo) -> WorkflowNodeProgress:
    attempts = n.retried + (1 if n.state is TaskState.COMPLETED else 0)
    return WorkflowNodeProgress(
        n.name,
        n.type,
        n.queue,
        n.task_id,
        n.on_failure,
        n.after,
        GONE if n.state is None else n.state.value,
        attempts,
        n.last_error,
    )


def _outcome(n: WorkflowNodeInfo) -> str:
    """``ok``, ``unfinished``, ``failed``, ``cancelled`` or ``tolerated`` (failed or
    skipped without failing the workflow)."""
    if n.state is None or n.state is TaskState.COMPLETED:
        return "ok"
    if n.state is not TaskState.ARCHIVED:
        return "unfinished"
    error = n.last_error or ""
    if error == lifecycle.CANCELLED:
        return "cancelled"
    cascade = NOT_RUN.match(error)
    if cascade is not None:
        return "failed" if cascade.group(1) == "not run" else "tolerated"
    return "failed" if n.on_failure == "cancel" else "tolerated"
