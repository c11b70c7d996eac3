"""A workflow's graph laid out for the dashboard's server-rendered SVG: layers left to right,
no script in the browser.

Each node's layer is the length of the longest path to it (a node sits right of every node it
runs after); within a layer, nodes are ordered by the mean position of their neighbours in the
layer before (then after), a few sweeps each way (the barycentre heuristic), which keeps most
edges short and uncrossed. Edges are cubic curves from a node's right side to the left side of
the node that runs after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from durq.workflow_progress import WorkflowNodeProgress

#: A node's box and the gaps between layers and between nodes of one layer, in pixels.
NODE_W, NODE_H = 168, 40
GAP_X, GAP_Y = 64, 14
MARGIN = 12
#: Ordering sweeps (down then up) of the barycentre heuristic.
SWEEPS = 4
#: Characters of a node's name shown in its box (the whole name is its tooltip).
LABEL_MAX = 20


@dataclass(frozen=True, slots=True)
class PlacedNode:
    """A node's box: top-left corner, its label and its node."""

    x: float
    y: float
    label: str
    node: WorkflowNodeProgress


@dataclass(frozen=True, slots=True)
class PlacedEdge:
    """An edge from ``source`` to ``target`` (the node that runs after it) as an SVG path."""

    source: str
    target: str
    path: str


@dataclass(frozen=True, slots=True)
class Layout:
    """Everything the SVG template draws."""

    width: float
    height: float
    node_w: float
    node_h: float
    nodes: tuple[PlacedNode, ...]
    edges: tuple[PlacedEdge, ...]


def layers(nodes: Sequence[WorkflowNodeProgress]) -> dict[str, int]:
    """Each node's layer: 0 for a node that runs after none, else one more than the deepest
    node it runs after. ``nodes`` come in creation order (each after those it runs after);
    a name in ``after`` that is not among them is ignored."""
    layer: dict[str, int] = {}
    for n in nodes:
        layer[n.name] = 1 + max((layer[a] for a in n.after if a in layer), default=-1)
    return layer


def _order(nodes: Sequence[WorkflowNodeProgress], layer: dict[str, int]) -> list[list[str]]:
    """The nodes of each layer, ordered to keep edges short (barycentre sweeps)."""
    rows: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for n in nodes:
        rows[layer[n.name]].append(n.name)
    before = {n.name: [a for a in n.after if a in layer] for n in nodes}
    after: dict[str, list[str]] = {n.name: [] for n in nodes}
    for name, deps in before.items():
        for dep in deps:
            after[dep].append(name)

    def sweep(order: range, neighbours: dict[str, list[str]], ref: int) -> None:
        for i in order:
            position = {name: p for p, name in enumerate(rows[i + ref])}
            current = {name: p for p, name in enumerate(rows[i])}
            rows[i].sort(
                key=lambda name: (_centre(name, neighbours, position, current), current[name])
            )

    for _ in range(SWEEPS):
        sweep(range(1, len(rows)), before, -1)
        sweep(range(len(rows) - 2, -1, -1), after, 1)
    return rows


def _centre(
    name: str,
    neighbours: dict[str, list[str]],
    position: dict[str, int],
    current: dict[str, int],
) -> float:
    """The mean position of ``name``'s neighbours in the reference layer; a node without
    neighbours there keeps its place."""
    near = [position[m] for m in neighbours[name] if m in position]
    return sum(near) / len(near) if near else float(current[name])


def layout(nodes: Sequence[WorkflowNodeProgress]) -> Layout:
    """Place ``nodes`` (in creation order) and their edges."""
    layer = layers(nodes)
    rows = _order(nodes, layer)
    tallest = max((len(r) for r in rows), default=0)
    height = 2 * MARGIN + tallest * NODE_H + max(tallest - 1, 0) * GAP_Y
    by_name = {n.name: n for n in nodes}
    where: dict[str, tuple[float, float]] = {}
    placed: list[PlacedNode] = []
    for i, row in enumerate(rows):
        x = MARGIN + i * (NODE_W + GAP_X)
        # Each layer centred vertically on the tallest.
        top = (height - len(row) * NODE_H - (len(row) - 1) * GAP_Y) / 2
        for j, name in enumerate(row):
            y = top + j * (NODE_H + GAP_Y)
            where[name] = (x, y)
            placed.append(PlacedNode(x, y, _label(name), by_name[name]))
    edges = []
    for n in nodes:
        for dep in n.after:
            if dep not in where:
                continue
            (x1, y1), (x2, y2) = where[dep], where[n.name]
            sx, sy, tx, ty = x1 + NODE_W, y1 + NODE_H / 2, x2, y2 + NODE_H / 2
            bend = max((tx - sx) / 2, GAP_X / 2)
            path = f"M{sx:g},{sy:g} C{sx + bend:g},{sy:g} {tx - bend:g},{ty:g} {tx:g},{ty:g}"
            edges.append(PlacedEdge(dep, n.name, path))
    width = 2 * MARGIN + len(rows) * NODE_W + max(len(rows) - 1, 0) * GAP_X
    return Layout(width, height, NODE_W, NODE_H, tuple(placed), tuple(edges))


def _label(name: str) -> str:
    return name if len(name) <= LABEL_MAX else name[: LABEL_MAX - 1] + "…"
