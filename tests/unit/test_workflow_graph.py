"""A workflow's graph is checked whole before a broker is asked: names, order, cycles."""

from __future__ import annotations

import pytest

import durq
from durq import workflows
from durq.brokers.dependencies import graph_edges
from durq.brokers.params import EnqueueParams
from durq.workflows import Workflow


def test_order_puts_each_node_after_those_it_names_whatever_the_order_added() -> None:
    wf = Workflow("etl")
    wf.add("etl:load", name="load", after=["transform", "extract"])
    wf.add("etl:transform", name="transform", after=["extract"])
    wf.add("etl:extract", name="extract")
    assert wf.order() == ["extract", "transform", "load"]
    assert wf.finals() == ("load",)
    assert [n.name for n in wf.nodes] == ["load", "transform", "extract"]


def test_a_node_is_named_after_its_type_unless_named() -> None:
    wf = Workflow("w")
    a = wf.add("etl:extract")
    assert a == durq.Node("etl:extract", "etl:extract")
    with pytest.raises(durq.WorkflowError, match="already"):
        wf.add("etl:extract", {})
    b = wf.add("etl:extract", {}, name="second", after=[a, a, "etl:extract"])
    assert wf.after(b.name) == ("etl:extract",)


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        ({"a": ["a"]}, ("a", "a")),
        ({"a": ["b"], "b": ["a"]}, ("a", "b", "a")),
        ({"a": ["c"], "b": ["a"], "c": ["b"], "d": []}, ("a", "b", "c", "a")),
        ({"x": [], "a": ["x", "c"], "b": ["a"], "c": ["b"], "tail": ["c"]}, ("a", "b", "c", "a")),
    ],
)
def test_a_cycle_is_refused_and_named_in_run_order(
    edges: dict[str, list[str]], cycle: tuple[str, ...]
) -> None:
    wf = Workflow("loop")
    for name, after in edges.items():
        wf.add("t", name=name, after=after)
    with pytest.raises(durq.WorkflowCycleError) as caught:
        wf.order()
    assert caught.value.cycle == cycle
    assert " -> ".join(cycle) in str(caught.value)


def test_bad_input_is_refused_with_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(durq.WorkflowError, match="no nodes"):
        Workflow("empty").order()
    with pytest.raises(durq.WorkflowError, match="on_failure"):
        Workflow("w", on_failure="retry")  # type: ignore[arg-type]
    with pytest.raises(durq.WorkflowError, match="workflow id"):
        Workflow("w", id="has space")
    with pytest.raises(durq.InvalidNameError):
        Workflow("w").add("t", name="no spaces")
    with pytest.raises(durq.WorkflowError, match="after= as nodes"):
        Workflow("w").add("t", after=["x"], connection=object())
    with pytest.raises(durq.WorkflowError, match="nodes or node names"):
        Workflow("w").add("t", after=[3])  # type: ignore[list-item]
    monkeypatch.setattr(workflows, "MAX_NODES", 2)
    big = Workflow("big")
    big.add("t", name="one")
    big.add("t", name="two")
    with pytest.raises(durq.WorkflowError, match="at most 2 nodes"):
        big.add("t", name="three")


def test_node_ids_derive_from_the_workflow_id() -> None:
    wf = Workflow("w", id="run-7")
    assert wf.node_id("etl:load") == "wf:run-7:etl:load"


def test_graph_edges_name_earlier_items_only() -> None:
    def p(task_id: str, *after: str) -> EnqueueParams:
        return EnqueueParams(task_id, "q", "t", b"{}", after=tuple(("q", a) for a in after))

    assert graph_edges([p("a"), p("b", "a"), p("c", "a", "b", "a")]) == [(), (0,), (0, 1)]
    with pytest.raises(ValueError, match="no earlier task"):
        graph_edges([p("a", "b"), p("b")])
