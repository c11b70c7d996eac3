"""Workflows a running task starts and waits for (``ctx.run_workflow``): fan-out decided at
run time.

A handler builds a :class:`~durq.Workflow` from what it found (one node per row of a file,
say) and awaits ``ctx.run_workflow(wf, timeout=...)``. That is a durable step of the task:

1. The child workflow is created whole (``enqueue_workflow``) under an id derived from the
   task and the step, so a run of the task that comes again after a crash or a timeout finds
   the same workflow instead of creating a second one (a creation refused because that id
   exists is that workflow). The step is recorded once it exists.
2. A last node of durq's own (:data:`DONE_TYPE`) runs after the child's final nodes,
   whatever their outcome, and signals the task with their results or the failure.
3. The task waits for that signal as ``ctx.wait_for`` does: its attempt ends, it holds no
   worker slot while the child runs, and it runs again when the signal comes, replaying its
   recorded steps; ``run_workflow`` then returns the child's results (as ``app.wait`` on a
   workflow returns them) or raises :class:`~durq.WorkflowFailedError`.

So the nodes after the task in its own workflow wait for its child too: the task completes
only after it, with what it made of the child's results ("one task per row, then merge").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from durq.errors import InvalidStateError, TaskIDConflictError, TaskNotFoundError
from durq.lifecycle import CANCELLED
from durq.taskdef import TaskRegistry
from durq.workflows import NOT_RUN, NodeFailed, Workflow, WorkflowError

if TYPE_CHECKING:
    from durq.brokers.contract import FullBroker
    from durq.task import TaskContext, TaskInfo
    from durq.workflows import WorkflowInfo

log = logging.getLogger("durq.worker")

#: The node that signals the task waiting for a child workflow.
DONE_TYPE = "durq:workflow-done"
#: Its name in the child workflow.
DONE_NODE = "durq-done"
#: How long the done node's own record is kept (its work is the signal).
_DONE_RETENTION = 3600.0


class ChildHost(TaskRegistry, Protocol):
    """What the done node's handler and :class:`ChildWorkflows` need of an app."""

    async def enqueue_workflow(self, workflow: Workflow) -> WorkflowInfo: ...

    async def signal(
        self, task: TaskInfo | str, name: str, payload: Any = None, *, queue: str | None = None
    ) -> bool: ...

    async def broker(self) -> FullBroker: ...


def child_id(queue: str, task_id: str, step: str) -> str:
    """The id of the workflow a task's step starts: the same on every run of the task."""
    digest = hashlib.sha256(f"{queue}\0{task_id}\0{step}".encode()).hexdigest()
    return f"child-{digest[:32]}"


def signal_name(workflow_id: str) -> str:
    """The signal the done node sends to the task waiting for workflow ``workflow_id``."""
    return f"workflow.{workflow_id}"


def as_child(workflow: Workflow, queue: str, task_id: str, step: str) -> Workflow:
    """``workflow`` as the child of task ``task_id`` (in ``queue``) at ``step``: its id
    derived from them, and the done node after its final nodes, in the task's queue unless
    the workflow names one."""
    wid = child_id(queue, task_id, step)
    child = Workflow(
        workflow.name,
        id=wid,
        on_failure=workflow.on_failure,  # type: ignore[arg-type]
        retention=workflow.retention,
        queue=workflow.queue,
    )
    child._specs = dict(workflow._specs)
    waited = {dep for spec in child._specs.values() for dep in spec.after}
    finals = [name for name in child._specs if name not in waited]
    if DONE_NODE in child._specs:
        raise WorkflowError(f"{DONE_NODE!r} names durq's own node of a child workflow")
    child.add(
        DONE_TYPE,
        {
            "queue": queue,
            "id": task_id,
            "signal": signal_name(wid),
        },
        name=DONE_NODE,
        after=finals,
        always=True,
        queue=workflow.queue or queue,
        max_retry=10,
        retention=_DONE_RETENTION,
    )
    child._own_nodes.add(DONE_NODE)
    return child


def answer(dependencies: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """What the done node signals, from its ``ctx.dependencies`` (the child's final nodes,
    a sub-workflow's grouped under its name): ``{"results": ...}`` as ``app.wait`` returns
    them (a node skipped, or failed with ``on_failure`` skip or continue, left out), or
    ``{"failed": {"node", "error"}}`` naming the node whose failure stopped the workflow."""
    results: dict[str, Any] = {}
    for name, value in dependencies.items():
        if isinstance(value, dict) and any(_failed_within(value)):
            # A sub-workflow's results (a handler's own JSON holds no NodeFailed).
            inner = answer(value, f"{prefix}{name}.")
            if "failed" in inner:
                return inner
            results[name] = inner["results"]
        elif not isinstance(value, NodeFailed):
            results[name] = value
        else:
            failed = _stopped_by(prefix + name, value)
            if failed is not None:
                return {"failed": failed}
    return {"results": results}


def _failed_within(value: Mapping[str, Any]) -> list[bool]:
    return [
        isinstance(v, NodeFailed) or (isinstance(v, dict) and any(_failed_within(v)))
        for v in value.values()
    ]


def _stopped_by(name: str, value: NodeFailed) -> dict[str, str] | None:
    """The node whose failure stopped the workflow, when final node ``name`` did not
    complete (``None``: skipped, or failed with ``on_failure`` skip or continue)."""
    error = value.error or ""
    cascade = NOT_RUN.match(error)
    if cascade is not None:
        return None if cascade.group(1) == "skipped" else {"node": cascade.group(2), "error": error}
    if value.on_failure != "cancel":
        return None
    what = "was cancelled" if error == CANCELLED else f"failed: {error or 'no error'}"
    return {"node": name, "error": what}


class ChildWorkflows:
    """Creates a task's child workflows for ``ctx.run_workflow`` (given to each context by
    the worker)."""

    def __init__(self, app: ChildHost) -> None:
        self._app = app

    async def create(
        self, workflow: Workflow, queue: str, task_id: str, step: str
    ) -> tuple[str, str]:
        """Create ``workflow`` as the child of the task at ``step`` (once: a run that comes
        again finds the first one). Returns its id and the signal its done node sends."""
        child = as_child(workflow, queue, task_id, step)
        try:
            await self._app.enqueue_workflow(child)
        except TaskIDConflictError:
            # An earlier run created it and ended before its step was recorded: that one
            # (its done node exists), else a node's own task_id is taken and this is no retry.
            _, _, _, options = child.spec(DONE_NODE)
            admin = (await self._app.broker()).admin
            try:
                await admin.get_task(options["queue"], child.node_id(DONE_NODE))
            except TaskNotFoundError:
                pass
            else:
                return child.id, signal_name(child.id)
            raise
        return child.id, signal_name(child.id)


def install(app: ChildHost) -> None:
    """Register the done node's handler on ``app``."""

    async def done(payload: dict[str, Any], ctx: TaskContext) -> None:
        told = answer(ctx.dependencies)
        try:
            await app.signal(payload["id"], payload["signal"], told, queue=payload["queue"])
        except (TaskNotFoundError, InvalidStateError):
            # The task that waited has ended (cancelled, or it stopped waiting): nobody to
            # tell, and telling again would change nothing.
            log.info("child workflow %s: its task %s has ended", ctx.id, payload["id"])

    app.tasks.pop(DONE_TYPE, None)
    app.task(DONE_TYPE, max_retry=10, retention=_DONE_RETENTION)(done)


__all__ = ["DONE_TYPE", "ChildWorkflows", "answer", "as_child", "child_id", "install"]
