"""The inspector's search: tasks of one queue and state filtered by type, error text and
payload fields, paged, with the number that match in all (every broker)."""

from __future__ import annotations

import pytest
from brokerkit import LATER, Q, R, claim, params

from conformance.conftest import requires
from durq.brokers import FullBroker
from durq.brokers.base import CAP_LIMITS, RetryParams, TaskFilter, TaskSearch
from durq.clock import FakeClock
from durq.errors import QueueNotFoundError
from durq.states import TaskState
from durq.task import LimitSpec

P = TaskState.PENDING
TASKS = [
    ("a1", "invoice.send", {"partner": "acme", "amount": 7, "urgent": True}),
    ("a2", "invoice.send", {"partner": "globex", "amount": 7.5, "customer": {"id": "c-9"}}),
    ("a3", "report.build", {"partner": "acme", "amount": "7", "urgent": False}),
    ("a4", "report.build", {"partner": ["acme"], "amount": None}),
]


async def enqueue_all(broker: FullBroker) -> None:
    for task_id, task_type, payload in TASKS:
        await broker.enqueue(params(task_id, type=task_type, payload=payload))
    # A payload that is not JSON must not break a search by payload field.
    bad = params("a5", type="report.build")
    await broker.enqueue(type(bad)(**{**_fields(bad), "payload": b"\xff not json"}))


def _fields(p: object) -> dict[str, object]:
    return {name: getattr(p, name) for name in p.__slots__}  # type: ignore[attr-defined]


async def found(broker: FullBroker, where: TaskFilter, state: TaskState = P) -> list[str]:
    result = await broker.search_tasks(TaskSearch(Q, state, where, limit=50))
    assert result.total == len(result.tasks)
    assert result.complete
    return [t.id for t in result.tasks]


@pytest.mark.parametrize(
    ("where", "ids"),
    [
        (TaskFilter(), ["a1", "a2", "a3", "a4", "a5"]),
        (TaskFilter(type="invoice.send"), ["a1", "a2"]),
        (TaskFilter(type="invoice"), []),
        (TaskFilter(payload=(("partner", "acme"),)), ["a1", "a3"]),
        (TaskFilter(type="report.build", payload=(("partner", "acme"),)), ["a3"]),
        # A number matches its JSON literal, a string its text: "7" finds both.
        (TaskFilter(payload=(("amount", "7"),)), ["a1", "a3"]),
        (TaskFilter(payload=(("amount", "7.5"),)), ["a2"]),
        (TaskFilter(payload=(("urgent", "true"),)), ["a1"]),
        (TaskFilter(payload=(("urgent", "false"),)), ["a3"]),
        (TaskFilter(payload=(("customer.id", "c-9"),)), ["a2"]),
        (TaskFilter(payload=(("partner", "acme"), ("amount", "7"))), ["a1", "a3"]),
        (TaskFilter(payload=(("partner", "acme"), ("urgent", "true"))), ["a1"]),
        # Arrays, objects and null match nothing; neither does a missing field.
        (TaskFilter(payload=(("amount", "null"),)), []),
        (TaskFilter(payload=(("customer", "c-9"),)), []),
        (TaskFilter(payload=(("nothing", "acme"),)), []),
    ],
)
async def test_search_by_type_and_payload(
    broker: FullBroker, where: TaskFilter, ids: list[str]
) -> None:
    await enqueue_all(broker)
    assert await found(broker, where) == ids


async def test_search_by_error_text_is_case_insensitive(
    broker: FullBroker, clock: FakeClock
) -> None:
    for task_id, error in [("r1", "Timeout talking to ACME"), ("r2", "refused"), ("r3", "")]:
        await broker.enqueue(params(task_id))
        (lease,) = await claim(broker)
        assert await broker.retry(RetryParams(lease.ref, error, LATER))
    await broker.enqueue(params("p1"))
    assert await found(broker, TaskFilter(error="acme"), R) == ["r1"]
    assert await found(broker, TaskFilter(error="E"), R) == ["r1", "r2"]
    assert await found(broker, TaskFilter(error="acme")) == []  # pending: no error


async def test_search_pages_in_list_order_with_the_total(broker: FullBroker) -> None:
    for i in range(7):
        partner = "acme" if i % 2 == 0 else "other"
        await broker.enqueue(params(f"t{i}", payload={"partner": partner}))
    where = TaskFilter(payload=(("partner", "acme"),))
    pages = [
        await broker.search_tasks(TaskSearch(Q, P, where, limit=3, offset=offset))
        for offset in (0, 3, 6)
    ]
    assert [[t.id for t in page.tasks] for page in pages] == [["t0", "t2", "t4"], ["t6"], []]
    assert [page.total for page in pages] == [4, 4, 4]


async def test_search_of_an_unknown_queue_is_refused(broker: FullBroker) -> None:
    with pytest.raises(QueueNotFoundError):
        await broker.search_tasks(TaskSearch("nowhere", P, TaskFilter()))


async def test_search_finds_tasks_held_by_a_limit(broker: FullBroker, clock: FakeClock) -> None:
    """A task held back by its limit is pending: the search shows it with its reason."""
    requires(broker, CAP_LIMITS)
    acme = {"partner": "acme"}
    for task_id in ("h0", "h1", "h2"):
        await broker.enqueue(params(task_id, payload=acme, limits=(LimitSpec("acme", 1),)))
        clock.advance(0.001)
    await broker.enqueue(params("free", payload=acme))
    assert sorted(lease.task.id for lease in await claim(broker)) == ["free", "h0"]
    result = await broker.search_tasks(TaskSearch(Q, P, TaskFilter(payload=(("partner", "acme"),))))
    assert sorted(t.id for t in result.tasks) == ["h1", "h2"]
    assert result.total == 2 and result.complete
    assert {t.held_by for t in result.tasks} == {"acme"}
    page = await broker.search_tasks(TaskSearch(Q, P, TaskFilter(), limit=1, offset=1))
    assert len(page.tasks) == 1 and page.total == 2
