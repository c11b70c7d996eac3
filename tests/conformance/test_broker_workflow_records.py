"""A workflow's stored record on every broker (W21): written by ``enqueue_graph`` in the same
atomic step as its nodes (all or nothing), read back with its nodes' tasks as they are now,
listed newest first by pages, and dropped by the janitor once its retention has passed and
none of its nodes' tasks is left."""

from __future__ import annotations

import pytest
from brokerkit import claim, params, put

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import CAP_DEPENDENCIES, ArchiveParams, CompleteParams, EnqueueParams
from durq.brokers.params import WorkflowNodeParams, WorkflowParams
from durq.brokers.views import WorkflowQuery, WorkflowRecord
from durq.clock import FakeClock
from durq.errors import TaskIDConflictError, WorkflowNotFoundError
from durq.states import TaskState

P, W, C, X = TaskState.PENDING, TaskState.WAITING, TaskState.COMPLETED, TaskState.ARCHIVED


@pytest.fixture(autouse=True)
def _dependencies(broker: FullBroker) -> None:
    if CAP_DEPENDENCIES not in broker.capabilities:
        pytest.skip(f"{broker.name} lacks {CAP_DEPENDENCIES}")


def graph(
    wf_id: str, edges: dict[str, tuple[str, ...]], *, retention: float = 100.0
) -> tuple[list[EnqueueParams], WorkflowParams]:
    """The tasks ``wf:<id>:<node>`` of ``edges`` (node -> the nodes it runs after, in an
    order where each comes after those) and the workflow's record."""
    task_id = {name: f"wf:{wf_id}:{name}" for name in edges}
    items = [
        params(task_id[name], after=tuple(("default", task_id[a]) for a in after))
        for name, after in edges.items()
    ]
    nodes = tuple(
        WorkflowNodeParams(name, "default", task_id[name], p.type, "cancel", after)
        for (name, after), p in zip(edges.items(), items, strict=True)
    )
    return items, WorkflowParams(wf_id, f"etl-{wf_id}", retention, nodes)


DIAMOND = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}


def states(record: WorkflowRecord) -> dict[str, TaskState | None]:
    return {n.name: n.state for n in record.nodes}


async def test_W21_the_record_is_written_with_the_nodes(
    broker: FullBroker, clock: FakeClock
) -> None:
    items, wf = graph("w1", DIAMOND, retention=321.0)
    await broker.enqueue_graph(items, wf)
    record = await broker.admin.get_workflow("w1")
    assert (record.id, record.name, record.retention) == ("w1", "etl-w1", 321.0)
    assert record.created_at == pytest.approx(clock.now(), abs=1e-6)
    assert [(n.name, n.queue, n.task_id, n.after) for n in record.nodes] == [
        (n.name, n.queue, n.task_id, n.after) for n in wf.nodes
    ]
    assert states(record) == {"a": P, "b": W, "c": W, "d": W}
    with pytest.raises(WorkflowNotFoundError):
        await broker.admin.get_workflow("w2")


async def test_W21_node_states_are_read_from_the_tasks(broker: FullBroker) -> None:
    items, wf = graph("w1", DIAMOND)
    await broker.enqueue_graph(items, wf)
    (lease,) = await claim(broker)
    assert await broker.complete(CompleteParams(lease.ref, b'"ok"', 60.0))
    leases = await claim(broker)
    assert states(await broker.admin.get_workflow("w1")) == {
        "a": C,
        "b": TaskState.ACTIVE,
        "c": TaskState.ACTIVE,
        "d": W,
    }
    b = next(lease for lease in leases if lease.task.id == "wf:w1:b")
    assert await broker.archive(ArchiveParams(b.ref, "boom"))
    node = {n.name: n for n in (await broker.admin.get_workflow("w1")).nodes}
    assert (node["b"].state, node["b"].last_error) == (X, "boom")
    await lifecycle.delete_task(broker.admin, "default", "wf:w1:b")
    assert states(await broker.admin.get_workflow("w1"))["b"] is None


async def test_W21_a_refused_graph_writes_no_record(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"wf:w1:c": TaskState.SCHEDULED})
    items, wf = graph("w1", DIAMOND)
    with pytest.raises(TaskIDConflictError):
        await broker.enqueue_graph(items, wf)
    with pytest.raises(WorkflowNotFoundError):
        await broker.admin.get_workflow("w1")
    assert (await broker.admin.list_workflows(WorkflowQuery())).records == ()


async def test_W21_listing_is_newest_first_by_pages_and_bounds(
    broker: FullBroker, clock: FakeClock
) -> None:
    created = {}
    for i in range(7):
        items, wf = graph(f"w{i}", {"a": (), "b": ("a",)})
        await broker.enqueue_graph(items, wf)
        created[f"w{i}"] = clock.now()
        # Two records share a creation time: the id orders them.
        if i != 3:
            clock.advance(1.25)
    newest_first = sorted(created, key=lambda w: (created[w], w), reverse=True)
    seen: list[str] = []
    cursor = None
    while True:
        page = await broker.admin.list_workflows(WorkflowQuery(limit=3, cursor=cursor))
        seen += [r.id for r in page.records]
        assert all(len(r.nodes) == 2 for r in page.records)
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == newest_first
    bounded = await broker.admin.list_workflows(
        WorkflowQuery(created_after=created["w2"], created_before=created["w5"])
    )
    expected = [w for w in newest_first if created["w2"] <= created[w] < created["w5"]]
    assert [r.id for r in bounded.records] == expected
    assert bounded.cursor is None


async def test_W21_the_janitor_drops_a_record_after_its_retention_and_its_nodes(
    broker: FullBroker, clock: FakeClock
) -> None:
    items, wf = graph("w1", {"a": (), "b": ("a",)}, retention=50.0)
    await broker.enqueue_graph(items, wf)
    for _ in range(2):
        (lease,) = await claim(broker)
        assert await broker.complete(CompleteParams(lease.ref, b'"ok"', 200.0))
    clock.advance(100)
    # Past its own retention, but its nodes' results are kept longer: it stays.
    await broker.delete_expired(100)
    assert states(await broker.admin.get_workflow("w1")) == {"a": C, "b": C}
    clock.advance(101)
    await broker.delete_expired(100)
    with pytest.raises(WorkflowNotFoundError):
        await broker.admin.get_workflow("w1")
    assert (await broker.admin.list_workflows(WorkflowQuery())).records == ()


async def test_W21_a_record_whose_retention_has_not_passed_stays(
    broker: FullBroker, clock: FakeClock
) -> None:
    items, wf = graph("w1", {"a": ()}, retention=500.0)
    await broker.enqueue_graph(items, wf)
    (lease,) = await claim(broker)
    assert await broker.complete(CompleteParams(lease.ref, b'"ok"', 10.0))
    clock.advance(20)
    await broker.delete_expired(100)
    assert states(await broker.admin.get_workflow("w1")) == {"a": None}
    # A new workflow under that id (its tasks are gone) replaces the record.
    items, wf = graph("w1", {"x": (), "y": ("x",)})
    await broker.enqueue_graph(items, wf)
    record = await broker.admin.get_workflow("w1")
    assert states(record) == {"x": P, "y": W}
    assert record.created_at == pytest.approx(clock.now(), abs=1e-6)
    assert [r.id for r in (await broker.admin.list_workflows(WorkflowQuery())).records] == ["w1"]
