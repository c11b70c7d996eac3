"""Workflows: a graph of tasks created all or none, results passed downstream.

A :class:`Workflow` is built in memory (``wf.add(...)``, in any order; ``after=`` names
nodes by handle or name), checked whole (unknown names, cycles) and handed to
``app.enqueue_workflow``, which creates every node in one atomic broker step
(``enqueue_graph``): nodes without dependencies are claimable at once, the others are
``waiting`` and released by the countdown of :mod:`durq.brokers.dependencies`, in the same
transaction or script as the outcome of their last dependency.

Everything else is decided here, above the broker seam, once for every broker. Each node's
task carries the :data:`HEADER` (workflow, node name, on_failure, and its dependencies' queue
and id). Before a worker runs a node's handler it reads those dependencies
(:func:`gate`): their results become ``ctx.dependencies``; a failed one decides by its
``on_failure`` whether the node runs at all:

* ``"cancel"`` (default): the node is archived without running, its error
  ``not run: node 'x' failed``; its own dependents are then not run in turn, so the failure
  reaches every node downstream; ``app.wait(workflow)`` raises
  :class:`WorkflowFailedError` with node ``x``'s error and traceback.
* ``"skip"``: the node is archived without running, its error ``skipped: node 'x' failed``,
  and so are its dependents; the workflow does not fail for it: a final node skipped is
  left out of the result.
* ``"continue"``: the node runs; ``ctx.dependencies["x"]`` is a :class:`NodeFailed`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from durq import encryption as crypt
from durq import lifecycle
from durq.brokers.dependencies import MAX_AFTER
from durq.brokers.params import WorkflowNodeParams, WorkflowParams
from durq.errors import (
    DurqError,
    InvalidNameError,
    InvalidStateError,
    TaskArchivedError,
    TaskNotFoundError,
    ValidationError,
    WorkflowNotFoundError,
)
from durq.names import WORKFLOW_ID_MAX, check_node_name, check_queue, check_workflow_id
from durq.options import new_task_id
from durq.results import wait_for_end
from durq.states import FINISHED, TaskState
from durq.task import TaskInfo

if TYPE_CHECKING:
    from durq.brokers.contract import Admin, FullBroker
    from durq.brokers.params import EnqueueParams
    from durq.brokers.views import TaskOutcome
    from durq.encryption import Encryption

#: The header of a workflow node's task (JSON, see :func:`node_header`).
HEADER = "durq-workflow"
#: What a failed node means for the nodes that wait for it (see the module's docstring).
OnFailure = Literal["cancel", "skip", "continue"]
ON_FAILURE: tuple[str, ...] = ("cancel", "skip", "continue")
#: How long a node's result is kept at least (its dependents and ``app.wait`` read it).
DEFAULT_RETENTION = 86400.0
#: At most this many nodes in one workflow (one atomic broker step creates them all).
MAX_NODES = 10_000
#: A workflow id's length limit, so that ``wf:<id>:<node>`` fits a task id.
ID_MAX = WORKFLOW_ID_MAX
#: The error of a node that did not run because a dependency failed (policy, root node).
NOT_RUN = re.compile(r"^(not run|skipped): node '([^']+)' ")

__all__ = [
    "HEADER",
    "ON_FAILURE",
    "Node",
    "NodeFailed",
    "Workflow",
    "WorkflowCycleError",
    "WorkflowError",
    "WorkflowFailedError",
    "WorkflowInfo",
]


class WorkflowError(ValidationError):
    """Invalid workflow."""


class WorkflowCycleError(WorkflowError):
    """The workflow's dependencies form a cycle."""

    def __init__(self, message: str | None = None, *, cycle: Sequence[str] = ()) -> None:
        super().__init__(message)
        #: The node names of one cycle, its first name repeated at the end.
        self.cycle = tuple(cycle)


class WorkflowFailedError(DurqError):
    """A node of the workflow failed, and the nodes after it did not run."""

    def __init__(
        self, message: str | None = None, *, node: str = "", info: TaskInfo | None = None
    ) -> None:
        super().__init__(message)
        #: The name of the node that failed (not of those that did not run after it).
        self.node = node
        #: Its task as last read (``None``: it is gone).
        self.info = info
        #: Its one-line error and the last failed attempt's traceback.
        self.last_error = info.last_error if info is not None else None
        self.traceback = info.traceback if info is not None else None


@dataclass(frozen=True, slots=True)
class Node:
    """A node of a :class:`Workflow`, as ``wf.add`` returns it: pass it in ``after=``."""

    name: str
    type: str


@dataclass(frozen=True, slots=True)
class NodeFailed:
    """In ``ctx.dependencies`` of a node whose dependency failed with ``on_failure="continue"``:
    that dependency's name, its final state (``archived``, or ``None`` when it is gone) and
    its one-line error."""

    name: str
    state: TaskState | None
    error: str | None
    #: What the failed node's failure means for the nodes after it (its ``on_failure``).
    on_failure: str = field(default="cancel", compare=False)


@dataclass(frozen=True, slots=True)
class _Spec:
    node: Node
    payload: Any
    after: tuple[str, ...]
    on_failure: str | None
    options: dict[str, Any]
    #: A sub-workflow node: the workflow whose nodes it stands for.
    sub: Workflow | None = None
    #: Of the nodes it runs after, the sub-workflows: how their results group (see
    #: :func:`regroup`).
    groups: dict[str, Any] = field(default_factory=dict)
    #: Runs once the nodes it waits for have ended, whatever their outcome.
    always: bool = False


#: The type a sub-workflow's node shows (its :class:`Node` handle's ``type``).
SUB_WORKFLOW = "workflow"
#: Between a sub-workflow node's name and the names of the sub-workflow's nodes.
SUB_SEPARATOR = "."


class Workflow:
    """A graph of tasks, created all or none by ``app.enqueue_workflow``.

    ``name``: what the workflow is (letters, digits, ``_ . : -``), e.g. ``"nightly-etl"``;
    ``id``: unique per run (default: generated; give one to make a submission idempotent:
    a second one with that id is refused with TaskIDConflictError and creates nothing).
    ``on_failure``: the default of its nodes (``"cancel"``, ``"skip"`` or ``"continue"``,
    see :mod:`durq.workflows`). ``retention``: how long each node's result is kept at
    least (seconds, default a day), so that dependents and ``app.wait`` can read it.
    ``queue``: the default queue of its nodes (else each task type's)."""

    def __init__(
        self,
        name: str,
        *,
        id: str | None = None,
        on_failure: OnFailure = "cancel",
        retention: float = DEFAULT_RETENTION,
        queue: str | None = None,
    ) -> None:
        self.name = check_node_name(name, "workflow name")
        self.id = _check_id(new_task_id() if id is None else id)
        self.on_failure = _check_policy(on_failure)
        if isinstance(retention, bool) or not isinstance(retention, int | float) or retention < 0:
            raise WorkflowError(f"retention must be seconds >= 0, not {retention!r}")
        self.retention = float(retention)
        self.queue = None if queue is None else check_queue(queue)
        self._specs: dict[str, _Spec] = {}
        self._as_created: dict[str, _Spec] | None = None
        #: Nodes of durq's own (a child workflow's done node): their ``durq:`` type is
        #: enqueued as it is.
        self._own_nodes: set[str] = set()

    def add(
        self,
        type: str | Any,
        payload: Any = None,
        *,
        name: str | None = None,
        after: Iterable[Node | str] = (),
        on_failure: OnFailure | None = None,
        always: bool = False,
        **options: Any,
    ) -> Node:
        """Add a node: a task of ``type`` (a type name or a registered task) with
        ``payload``, and the options of ``app.enqueue`` (``queue``, ``task_id``,
        ``process_in``, ``max_retry``, ``timeout``, ``priority``, ``unique``, ``limit``…).
        ``name``: the node's name (default: the task type), unique in the workflow
        (WorkflowError otherwise). ``after``: the nodes it runs after, as handles or names;
        a name may be added later. ``on_failure``: what this node's failure means for the
        nodes after it (default: the workflow's). ``always=True``: the node runs once the
        nodes it waits for have ended, whatever their outcome (a clean-up, a report): the
        ones that did not complete are :class:`NodeFailed` in its ``ctx.dependencies``.
        Returns the node's handle."""
        type_name = type if isinstance(type, str) else getattr(type, "type", None)
        if not isinstance(type_name, str):
            raise WorkflowError(f"a node's type is a task type or a task, not {type!r}")
        node_name = check_node_name(type_name if name is None else name, "node name")
        if node_name in self._specs:
            raise WorkflowError(
                f"workflow {self.name!r} has a node named {node_name!r} already: give this "
                "one another name= (a node's name defaults to its task type)"
            )
        if "after" in options or "connection" in options:
            raise WorkflowError("a workflow node takes after= as nodes, and no connection=")
        names = tuple(dict.fromkeys(_name_of(a) for a in after))
        if len(names) > MAX_AFTER:
            raise WorkflowError(f"node {node_name!r} waits for more than {MAX_AFTER} nodes")
        if len(self._specs) >= MAX_NODES:
            raise WorkflowError(f"a workflow has at most {MAX_NODES} nodes")
        node = Node(node_name, type_name)
        policy = None if on_failure is None else _check_policy(on_failure)
        self._specs[node_name] = _Spec(
            node, payload, names, policy, dict(options), always=bool(always)
        )
        self._as_created = None
        return node

    def add_workflow(
        self,
        workflow: Workflow,
        *,
        name: str | None = None,
        after: Iterable[Node | str] = (),
        on_failure: OnFailure | None = None,
    ) -> Node:
        """Add ``workflow`` as one node (a sub-workflow): its nodes join this workflow as
        ``<name>.<node>`` (created with it, all or none), those that wait for none run after
        ``after=``, and the nodes that run after this one wait for all of its final nodes.
        Their ``ctx.dependencies[name]`` (and ``app.wait``'s result, when it is final) is
        the sub-workflow's result: its final nodes' results by their names in it.
        ``name`` defaults to the sub-workflow's name; ``on_failure``, when given, replaces
        the sub-workflow's default for its nodes that set none. The sub-workflow's own
        ``id`` and ``retention`` are not used: its nodes are this workflow's. Adding it
        copies nothing: nodes added to it later are part of it when this one is created."""
        if not isinstance(workflow, Workflow):
            raise WorkflowError(f"add_workflow takes a Workflow, not {workflow!r}")
        node_name = check_node_name(workflow.name if name is None else name, "node name")
        if node_name in self._specs:
            raise WorkflowError(
                f"workflow {self.name!r} has a node named {node_name!r} already: give this "
                "sub-workflow another name= (it defaults to the sub-workflow's name)"
            )
        names = tuple(dict.fromkeys(_name_of(a) for a in after))
        if len(names) > MAX_AFTER:
            raise WorkflowError(f"node {node_name!r} waits for more than {MAX_AFTER} nodes")
        node = Node(node_name, SUB_WORKFLOW)
        policy = None if on_failure is None else _check_policy(on_failure)
        self._specs[node_name] = _Spec(node, None, names, policy, {}, sub=workflow)
        self._as_created = None
        return node

    @property
    def nodes(self) -> list[Node]:
        """The nodes, in the order they were added (a sub-workflow as one node)."""
        return [s.node for s in self._specs.values()]

    def _flat(self, outer: tuple[Workflow, ...] = ()) -> dict[str, _Spec]:
        """The nodes as they are created: each sub-workflow's nodes in its place, named
        ``<sub>.<node>``, its first nodes after the sub-workflow node's ``after``, and a
        node after a sub-workflow after the sub-workflow's final nodes."""
        if self in outer:
            raise WorkflowError(f"workflow {self.name!r} contains itself")
        inner = {
            name: spec.sub._flat((*outer, self))
            for name, spec in self._specs.items()
            if spec.sub is not None
        }
        for name, nodes in inner.items():
            if not nodes:
                raise WorkflowError(f"sub-workflow {name!r} of {self.name!r} has no nodes")
        finals = {
            name: tuple(f"{name}{SUB_SEPARATOR}{f}" for f in _finals_of(flat))
            for name, flat in inner.items()
        }
        flat: dict[str, _Spec] = {}
        for name, spec in self._specs.items():
            # An unknown name is kept: order() says which node names it.
            after = tuple(dict.fromkeys(f for d in spec.after for f in finals.get(d, (d,))))
            groups = {d: self._tree(d) for d in spec.after if d in inner}
            sub = spec.sub
            if sub is None:
                flat[name] = replace(spec, after=after, groups=groups)
                continue
            prefix = name + SUB_SEPARATOR
            for inner_name, s in inner[name].items():
                options = dict(s.options)
                if sub.queue is not None:
                    options.setdefault("queue", sub.queue)
                flat[check_node_name(prefix + inner_name, "node name")] = replace(
                    s,
                    after=tuple(prefix + d for d in s.after) if s.after else after,
                    groups=_prefixed(s.groups, prefix) if s.after else groups,
                    on_failure=s.on_failure or spec.on_failure or sub.on_failure,
                    options=options,
                )
        if len(flat) > MAX_NODES:
            raise WorkflowError(f"a workflow has at most {MAX_NODES} nodes")
        return flat

    def _tree(self, name: str) -> dict[str, Any]:
        """How the results of sub-workflow node ``name``'s final nodes group: ``finals``
        (their names in it -> their names here) and ``groups`` (the same for its own
        sub-workflows among them)."""
        sub = self._specs[name].sub
        assert sub is not None
        return {
            "finals": {f: f"{name}{SUB_SEPARATOR}{f}" for f in sub.finals()},
            "groups": sub.final_groups(),
        }

    def final_groups(self) -> dict[str, Any]:
        """For the sub-workflows among the final nodes, how their results group."""
        waited = {dep for spec in self._specs.values() for dep in spec.after}
        return {
            name: self._tree(name)
            for name, spec in self._specs.items()
            if spec.sub is not None and name not in waited
        }

    def _created(self) -> dict[str, _Spec]:
        """The nodes as created (from :meth:`order`'s last run while nothing was added)."""
        if self._as_created is None:
            if all(spec.sub is None for spec in self._specs.values()):
                return self._specs
            self._as_created = self._flat()
        return self._as_created

    def after(self, name: str) -> tuple[str, ...]:
        """The names of the nodes ``name`` runs after (as created: see :meth:`order`)."""
        return self._created()[name].after

    def order(self) -> list[str]:
        """The node names in an order where each comes after those it waits for (among
        ready nodes, the order they were added). WorkflowError for an empty workflow or a
        name in ``after=`` that is no node; WorkflowCycleError naming one cycle."""
        self._as_created = None
        specs = self._created()
        if not specs:
            raise WorkflowError(f"workflow {self.name!r} has no nodes")
        for spec in specs.values():
            for dep in spec.after:
                if dep not in specs:
                    raise WorkflowError(
                        f"node {spec.node.name!r} runs after {dep!r}, which is no node of "
                        f"workflow {self.name!r}"
                    )
        left = {name: len(spec.after) for name, spec in specs.items()}
        dependents: dict[str, list[str]] = {name: [] for name in specs}
        for name, spec in specs.items():
            for dep in spec.after:
                dependents[dep].append(name)
        ready = [name for name, n in left.items() if n == 0]
        order: list[str] = []
        while ready:
            name = ready.pop(0)
            order.append(name)
            for d in dependents[name]:
                left[d] -= 1
                if left[d] == 0:
                    ready.append(d)
        if len(order) < len(specs):
            cycle = _cycle(specs, {name for name, n in left.items() if n > 0})
            raise WorkflowCycleError(
                f"workflow {self.name!r} has a cycle: {' -> '.join(cycle)}", cycle=cycle
            )
        return order

    def spec(self, name: str) -> tuple[Node, Any, str, dict[str, Any]]:
        """A node's handle, payload, on_failure (resolved) and enqueue options (``name`` as
        created: see :meth:`order`)."""
        s = self._created()[name]
        return s.node, s.payload, s.on_failure or self.on_failure, dict(s.options)

    def node_id(self, name: str) -> str:
        """The task id of node ``name`` unless its options give ``task_id``."""
        return f"wf:{self.id}:{name}"

    def finals(self) -> tuple[str, ...]:
        """The names of the nodes no other node runs after, in the order they were added
        (as created: a sub-workflow's final nodes in its place)."""
        return _finals_of(self._created())

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, id={self.id!r}, nodes={len(self._specs)})"


def _finals_of(specs: Mapping[str, _Spec]) -> tuple[str, ...]:
    """The names among ``specs`` no other one runs after, in order."""
    waited = {dep for spec in specs.values() for dep in spec.after}
    return tuple(name for name in specs if name not in waited)


def _prefixed(groups: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """``groups`` of a sub-workflow's node, with its final nodes' names as created here."""
    return {
        name: {
            "finals": {k: prefix + v for k, v in tree["finals"].items()},
            "groups": tree["groups"],
        }
        for name, tree in groups.items()
    }


def regroup(results: Mapping[str, Any], groups: Mapping[str, Any]) -> dict[str, Any]:
    """``results`` by node name as created, with each sub-workflow's final nodes gathered
    under the sub-workflow node's name (by their names in it), as ``groups`` says."""
    out = dict(results)
    for name, tree in groups.items():
        inner = {k: out.pop(v) for k, v in tree["finals"].items() if v in out}
        if inner:  # else every final node of it was skipped: left out, as such a node is
            out[name] = regroup(inner, tree["groups"])
    return out


def _cycle(specs: Mapping[str, _Spec], stuck: set[str]) -> list[str]:
    """One cycle among ``stuck`` (nodes left waiting): each waits for one of them."""
    names = list(specs)
    path: list[str] = []
    seen: dict[str, int] = {}
    name = min(stuck, key=names.index)
    while name not in seen:
        seen[name] = len(path)
        path.append(name)
        name = next(d for d in specs[name].after if d in stuck)
    # ``path`` walks from each node to one it waits for; a cycle reads in run order, from
    # the node added first.
    cycle = path[seen[name] :][::-1]
    first = min(range(len(cycle)), key=lambda i: names.index(cycle[i]))
    cycle = cycle[first:] + cycle[:first]
    return [*cycle, cycle[0]]


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow as ``app.enqueue_workflow`` created it: pass it to ``app.wait``."""

    id: str
    name: str
    #: Each node's task, by node name, in the order they were created: each after the nodes
    #: it runs after.
    nodes: Mapping[str, TaskInfo]
    #: The nodes no other node runs after: ``app.wait`` returns their results.
    finals: tuple[str, ...]
    #: How the results of sub-workflows among the finals group (see :func:`regroup`).
    groups: Mapping[str, Any] = field(default_factory=dict)


def record_of(
    wf: Workflow, order: Sequence[str], created: Mapping[str, EnqueueParams]
) -> WorkflowParams:
    """The stored record of ``wf`` whose nodes, in ``order``, became the tasks ``created``."""
    nodes = []
    for name in order:
        p = created[name]
        _, _, policy, _ = wf.spec(name)
        nodes.append(WorkflowNodeParams(name, p.queue, p.id, p.type, policy, wf.after(name)))
    return WorkflowParams(wf.id, wf.name, wf.retention, tuple(nodes))


def node_header(
    wf: Workflow, name: str, on_failure: str, after: Mapping[str, tuple[str, str]]
) -> str:
    """The :data:`HEADER` of node ``name``: ``{"id", "name", "node", "on_failure",
    "after": {name: [queue, id]}}``, ``after`` its dependencies' (queue, id), and
    ``"groups"`` when some of them are a sub-workflow's final nodes (see :func:`regroup`)."""
    header: dict[str, Any] = {
        "id": wf.id,
        "name": wf.name,
        "node": name,
        "on_failure": on_failure,
        "after": {dep: list(key) for dep, key in after.items()},
    }
    spec = wf._created()[name]
    if spec.groups:
        header["groups"] = spec.groups
    if spec.always:
        header["always"] = True
    return json.dumps(header, separators=(",", ":"))


def header_of(headers: Mapping[str, str]) -> dict[str, Any] | None:
    """A task's workflow header, decoded (``None``: not a workflow node)."""
    raw = headers.get(HEADER)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:  # not written by enqueue_workflow: the task is no node
        return None
    return value if isinstance(value, dict) else None


# -- the gate: what a worker reads before a node runs ------------------------------------------


@dataclass(frozen=True, slots=True)
class Gate:
    """What a node may do: run with ``dependencies`` (``ctx.dependencies``), or not run and
    be archived with ``stop`` as its error."""

    dependencies: dict[str, Any]
    stop: str | None = None


_SEVERITY = {"cancel": 2, "skip": 1}
_T = TypeVar("_T")


async def gate(admin: Admin, task: TaskInfo, encryption: Encryption | None) -> Gate:
    """Read the dependencies of a workflow node before its handler runs. A failed one (or
    one that did not run) with ``on_failure`` cancel or skip stops the node (cancel wins
    over skip); with continue it is a :class:`NodeFailed` in the dependencies."""
    header = header_of(task.headers) or {}
    after: dict[str, list[str]] = header.get("after") or {}
    always = header.get("always") is True
    names = list(after)
    infos = await _outcomes(admin, [(q, i) for q, i in after.values()])
    results: dict[str, Any] = {}
    worst: tuple[int, str] | None = None
    for name, info in zip(names, infos, strict=True):
        if info is not None and info.state is TaskState.COMPLETED:
            results[name] = crypt.decode(info.raw_result, encryption)
            continue
        stop = _stop_for(name, info)
        if stop is None or always:
            results[name] = _node_failed(name, info, stop)
            continue
        severity = _SEVERITY[stop[0]]
        if worst is None or severity > worst[0]:
            worst = (severity, stop[1])
    if worst is not None:
        return Gate({}, worst[1])
    return Gate(regroup(results, header.get("groups") or {}))


def _node_failed(name: str, info: TaskOutcome | None, stop: tuple[str, str] | None) -> NodeFailed:
    """A dependency that did not complete, as ``ctx.dependencies`` shows it."""
    if info is None:
        return NodeFailed(name, None, stop[1] if stop else None)
    policy = (header_of(info.headers) or {}).get("on_failure", "cancel")
    return NodeFailed(name, info.state, info.last_error, on_failure=str(policy))


def _stop_for(name: str, info: TaskOutcome | None) -> tuple[str, str] | None:
    """For a dependency that did not complete: (policy, the error of a node it stops), or
    ``None`` when the node runs anyway (``continue``)."""
    if info is None:
        return "cancel", f"not run: node {name!r} is gone (deleted before it completed)"
    cascade = NOT_RUN.match(info.last_error or "")
    if cascade is not None:  # did not run itself: its cause reaches this node too
        policy = "cancel" if cascade.group(1) == "not run" else "skip"
        return policy, info.last_error or ""
    policy = (header_of(info.headers) or {}).get("on_failure", "cancel")
    if policy == "continue":
        return None
    verb = "not run" if policy == "cancel" else "skipped"
    return policy, f"{verb}: node {name!r} failed: {info.last_error or 'no error recorded'}"


async def _read_all(admin: Admin, keys: Sequence[tuple[str, str]]) -> list[TaskInfo | None]:
    """The tasks of ``keys`` (queue, id), in order: one read per queue (a node waiting for a
    thousand nodes reads them in one round trip, not a thousand)."""
    return await _per_queue(admin.get_tasks, keys)


async def _outcomes(admin: Admin, keys: Sequence[tuple[str, str]]) -> list[TaskOutcome | None]:
    """What a node reads of its dependencies ``keys`` before it runs, as :func:`_read_all`
    reads: their state, result, error and headers (:meth:`Admin.get_outcomes`), not whole
    tasks, whose decoding the node's start would wait for."""
    return await _per_queue(admin.get_outcomes, keys)


async def _per_queue(
    read: Callable[[str, list[str]], Awaitable[list[_T | None]]],
    keys: Sequence[tuple[str, str]],
) -> list[_T | None]:
    """``read`` once per queue of ``keys`` (queue, id), at the same time; in ``keys``' order."""
    by_queue: dict[str, list[str]] = {}
    for queue, task_id in keys:
        by_queue.setdefault(queue, []).append(task_id)
    reads = await asyncio.gather(*(read(q, ids) for q, ids in by_queue.items()))
    found = {
        (queue, task_id): item
        for (queue, ids), items in zip(by_queue.items(), reads, strict=True)
        for task_id, item in zip(ids, items, strict=True)
    }
    return [found[key] for key in keys]


async def _read(admin: Admin, queue: str, task_id: str) -> TaskInfo | None:
    try:
        return await admin.get_task(queue, task_id)
    except TaskNotFoundError:
        return None


# -- waiting for a workflow ---------------------------------------------------------------------


async def wait_for(
    broker: FullBroker,
    info: WorkflowInfo,
    timeout: float | None,
    encryption: Encryption | None,
) -> dict[str, Any]:
    """The results of ``info``'s final nodes by name (a final node skipped, or failed with
    skip or continue, left out); WorkflowFailedError as soon as one of them failed or did
    not run because of a node that failed with ``on_failure="cancel"``."""

    async def one(name: str) -> tuple[str, Any, bool]:
        task = info.nodes[name]
        try:
            done = await wait_for_end(broker, task.queue, task.id, timeout)
        except TaskArchivedError as exc:
            failure = await _failure(broker.admin, info, name, exc.info)
            if failure is not None:
                raise failure from None
            return name, None, False
        header = header_of(task.headers) or {}
        if header.get("always"):
            # It ran whatever the nodes before it did: one of them may have failed the rest.
            after = header.get("after") or {}
            befores = await _read_all(broker.admin, [(q, i) for q, i in after.values()])
            for dep, before in zip(after, befores, strict=True):
                if before is None or before.state is not TaskState.COMPLETED:
                    failure = await _failure(broker.admin, info, dep, before)
                    if failure is not None:
                        raise failure
        return name, crypt.decode(done.raw_result, encryption), True

    waits = [asyncio.create_task(one(name)) for name in info.finals]
    results: dict[str, Any] = {}
    try:
        for next_done in asyncio.as_completed(waits):
            name, value, kept = await next_done
            if kept:
                results[name] = value
    finally:
        for w in waits:
            w.cancel()
        # Collected, so that a second failure at the same moment is not logged as unread.
        await asyncio.gather(*waits, return_exceptions=True)
    ordered = {name: results[name] for name in info.finals if name in results}
    return regroup(ordered, info.groups)


async def _failure(
    admin: Admin, info: WorkflowInfo, name: str, task: TaskInfo | None
) -> WorkflowFailedError | None:
    """The error a final node's archiving means for the workflow (``None``: none)."""
    error = "" if task is None else task.last_error or ""
    cascade = NOT_RUN.match(error)
    if cascade is not None:
        if cascade.group(1) == "skipped":
            return None
        root = cascade.group(2)
        node = info.nodes.get(root)
        task = None if node is None else await _read(admin, node.queue, node.id)
        name = root
    elif task is not None and (header_of(task.headers) or {}).get("on_failure") != "cancel":
        return None
    if task is None:
        what = "is gone"
    elif task.last_error == lifecycle.CANCELLED:
        what = "was cancelled"
    else:
        what = f"failed: {task.last_error or 'no error recorded'}"
    return WorkflowFailedError(
        f"workflow {info.name!r} ({info.id}): node {name!r} {what}", node=name, info=task
    )


async def cancel(admin: Admin, nodes: Iterable[tuple[str, str]]) -> int:
    """Cancel every node that has not finished among ``nodes`` (``(queue, task id)`` in the
    order they were created), the last created first (so a waiting node is cancelled before
    the nodes it waits for could release it): a pending, scheduled, retry or waiting one is
    archived "cancelled" at once, a running one is flagged and its worker cancels its
    handler. The workflows a node started with ``ctx.run_workflow`` are cancelled with it.
    Returns how many were cancelled."""
    done = 0
    keys = list(reversed(list(nodes)))
    for (queue, task_id), node in zip(keys, await _read_all(admin, keys), strict=True):
        if node is None or node.state in FINISHED:
            continue  # gone, or finished: nothing to cancel
        try:
            await lifecycle.cancel_task(admin, queue, task_id)
        except (TaskNotFoundError, InvalidStateError):
            continue  # it finished meanwhile
        done += 1
        for child in children_of(node):
            try:
                record = await admin.get_workflow(child)
            except WorkflowNotFoundError:
                continue
            done += await cancel(admin, [(n.queue, n.task_id) for n in record.nodes])
    return done


def children_of(task: TaskInfo) -> list[str]:
    """The ids of the workflows ``task`` started with ``ctx.run_workflow`` (recorded in its
    steps)."""
    return [
        step.result["workflow"]
        for step in task.steps
        if isinstance(step.result, dict)
        and isinstance(step.result.get("workflow"), str)
        and "signal" in step.result
    ]


def _name_of(node: Node | str) -> str:
    if isinstance(node, Node):
        return node.name
    if isinstance(node, str):
        return node
    raise WorkflowError(f"after= takes nodes or node names, not {node!r}")


def _check_policy(value: str) -> str:
    if value not in ON_FAILURE:
        raise WorkflowError(f"on_failure must be one of {', '.join(ON_FAILURE)}, not {value!r}")
    return value


def _check_id(value: str) -> str:
    try:
        return check_workflow_id(value)
    except InvalidNameError:
        raise WorkflowError(
            f"invalid workflow id {value!r}: 1-{ID_MAX} letters, digits and _ . - @ + ="
        ) from None
