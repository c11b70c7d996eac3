"""The inspector's search: tasks of one queue and state filtered by type, error text and
payload fields, paged, with the number that match in all (every broker)."""

from __future__ import annotations

import pytest
from brokerkit import LATER, Q, R, claim, params

from durq.brokers import FullBroker
from durq.brokers.base import RetryParams, TaskFilter, TaskSearch
from durq.clock import FakeClock
from durq.errors import QueueNotFoundError, ValidationError
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
    result = await broker.admin.search_tasks(TaskSearch(Q, state, where, limit=50))
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
        # A number matches a number of the same value, a string its text: "7" finds both.
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
        await broker.admin.search_tasks(TaskSearch(Q, P, where, limit=3, offset=offset))
        for offset in (0, 3, 6)
    ]
    assert [[t.id for t in page.tasks] for page in pages] == [["t0", "t2", "t4"], ["t6"], []]
    assert [page.total for page in pages] == [4, 4, 4]


async def test_search_of_an_unknown_queue_is_refused(broker: FullBroker) -> None:
    with pytest.raises(QueueNotFoundError):
        await broker.admin.search_tasks(TaskSearch("nowhere", P, TaskFilter()))


async def test_search_finds_tasks_held_by_a_limit(broker: FullBroker, clock: FakeClock) -> None:
    """A task held back by its limit is pending: the search shows it with its reason."""
    acme = {"partner": "acme"}
    for task_id in ("h0", "h1", "h2"):
        await broker.enqueue(params(task_id, payload=acme, limits=(LimitSpec("acme", 1),)))
        clock.advance(0.001)
    await broker.enqueue(params("free", payload=acme))
    assert sorted(lease.task.id for lease in await claim(broker)) == ["free", "h0"]
    result = await broker.admin.search_tasks(
        TaskSearch(Q, P, TaskFilter(payload=(("partner", "acme"),)))
    )
    assert sorted(t.id for t in result.tasks) == ["h1", "h2"]
    assert result.total == 2 and result.complete
    assert {t.held_by for t in result.tasks} == {"acme"}
    page = await broker.admin.search_tasks(TaskSearch(Q, P, TaskFilter(), limit=1, offset=1))
    assert len(page.tasks) == 1 and page.total == 2


# -- one meaning on every broker (durq.brokers.search) ------------------------------------------

# Payloads written as raw JSON, so that each number keeps its own spelling.
ODD = {
    "f1": '{"x": 1e-07}',
    "f2": '{"x": 0.0000001}',
    "f3": '{"x": 1e+20}',
    "f4": '{"x": 100000000000000000000}',
    "f5": '{"x": 18446744073709551616}',
    "f6": '{"x": -0.0}',
    "f7": '{"x": 0}',
    "f8": '{"x": 9007199254740993}',
    "f9": '{"x": 9007199254740992}',
    "s1": '{"x": "acme"}',
    "s2": '{"x": "acme\\u0000"}',
    "s3": '{"x": "acme", "note": "a\\u0000b"}',
    "s4": '{"x": "1e-07"}',
    "s5": '{"x": "acme", "bad": "\\ud800"}',
    "s6": '{"x": "ACME"}',
    "b1": '{"x": true}',
    "h1": '{"x": 1e400}',
    "h2": '{"x": 1e-400}',
    "a1": '{"items": ["acme"], "x": [7]}',
    "d1": '{"x": 7, "x": 8}',
    "n1": '{"x": 7.0}',
}


async def enqueue_raw(broker: FullBroker, payloads: dict[str, str]) -> None:
    for task_id, raw in payloads.items():
        p = params(task_id)
        await broker.enqueue(type(p)(**{**_fields(p), "payload": raw.encode()}))


@pytest.mark.parametrize(
    ("field", "value", "ids"),
    [
        # A number matches a JSON number text with the same double, whatever its spelling.
        ("x", "1e-07", ["f1", "f2", "s4"]),
        ("x", "0.0000001", ["f1", "f2"]),
        ("x", "1E-7", ["f1", "f2"]),
        ("x", "1e+20", ["f3", "f4"]),
        ("x", "1e20", ["f3", "f4"]),
        ("x", "18446744073709551616", ["f5"]),
        ("x", "18446744073709551615", ["f5"]),  # 2^64 - 1 is 2^64 as a double
        ("x", "-0.0", ["f6", "f7", "h2"]),  # 1e-400 is 0 as a double
        ("x", "0", ["f6", "f7", "h2"]),
        ("x", "9007199254740993", ["f8", "f9"]),  # past 2^53: the same double
        ("x", "7", ["n1"]),
        ("x", "8", ["d1"]),  # a repeated key: the last one counts
        ("x", "1e400", []),  # beyond the doubles: no number
        ("x", "+7", []),  # not JSON: text only
        ("x", "7.", []),
        ("x", "true", ["b1"]),
        # Strings match exactly; a payload with a NUL or a lone surrogate matches nothing.
        ("x", "acme", ["s1"]),
        ("x", "ACME", ["s6"]),
        ("items.0", "acme", []),  # paths go through objects only
        ("x.0", "7", []),
    ],
)
async def test_search_values_mean_the_same_on_every_broker(
    broker: FullBroker, field: str, value: str, ids: list[str]
) -> None:
    await enqueue_raw(broker, ODD)
    assert await found(broker, TaskFilter(payload=((field, value),))) == ids


async def test_error_text_is_ascii_case_insensitive_on_every_broker(
    broker: FullBroker, clock: FakeClock
) -> None:
    errors = {
        "e1": "Timeout talking to ÉCOLE",
        "e2": "straße ERROR",
        "e3": "İstanbul unreachable",
        "e4": "plain ascii",
    }
    for task_id, error in errors.items():
        await broker.enqueue(params(task_id))
        (lease,) = await claim(broker)
        assert await broker.retry(RetryParams(lease.ref, error, LATER))
    expected = {
        "école": [],  # É is not é: only A-Z fold
        "ÉCOLE": ["e1"],
        "cole": ["e1"],
        "STRAßE": ["e2"],
        "strasse": [],
        "error": ["e2"],
        "istanbul": [],
        "İSTANBUL": ["e3"],
        "ASCII": ["e4"],
    }
    for text, ids in expected.items():
        assert await found(broker, TaskFilter(error=text), R) == ids, text


@pytest.mark.parametrize(
    "where",
    [
        {"payload": (("x", "acme\x00"),)},
        {"payload": (("x", "\x00"),)},
        {"payload": (("x", "a\nb"),)},
        {"payload": (("x", "\ud800"),)},
        {"payload": (("x\n", "acme"),)},
        {"payload": (("x.", "acme"),)},
        {"error": "acme\x00"},
        {"error": "\x1b[31m"},
        {"error": "\x85"},
        {"type": "t\x00"},
    ],
)
def test_search_values_with_control_characters_are_refused_before_any_broker(
    where: dict[str, object],
) -> None:
    with pytest.raises(ValidationError):
        TaskFilter(**where)  # type: ignore[arg-type]


def _midpoint(a: float, b: float) -> str:
    from decimal import Context, Decimal
    from fractions import Fraction

    m = (Fraction(a) + Fraction(b)) / 2
    return str(Context(prec=2000).divide(Decimal(m.numerator), Decimal(m.denominator)))


# Spellings at the edges of the doubles: ties (to the even one), the largest and smallest.
HARD_NUMBERS = [
    "0.1",
    "0.30000000000000004",
    "0.3",
    "9007199254740993",  # a tie: rounds to ...992
    "9007199254740995",  # a tie: rounds to ...996
    "9007199254740994",
    "1.7976931348623157e308",
    "1.7976931348623158e308",  # still the largest double
    "1.7976931348623159e308",  # past the largest's upper bound: infinite
    "5e-324",
    "2.4703282292062328e-324",  # above half the smallest: the smallest
    "2.4703282292062327e-324",  # below it: zero
    _midpoint(0.0, 5e-324),  # exactly half: a tie, to zero (even)
    _midpoint(1.0, 1.0000000000000002),  # a tie, to 1 (even)
    _midpoint(1.0000000000000002, 1.0000000000000004),  # a tie, to ...04 (even)
    "-1e-07",
    "123456789012345678901234567890",
    "1" + "0" * 400,
]


async def test_numbers_at_the_edges_of_the_doubles_match_as_the_rule_says(
    broker: FullBroker,
) -> None:
    """Every broker against :func:`durq.brokers.search.payload_matches`, the rule's model."""
    from durq.brokers import search

    stored = {f"h{i}": f'{{"x": {text}}}' for i, text in enumerate(HARD_NUMBERS)}
    await enqueue_raw(broker, stored)
    wanted = sorted({*HARD_NUMBERS[:12], "1", "1.0000000000000004", "0", "-0", "1e-07"})
    for text in wanted:
        if len(text) > 200:
            continue
        expected = [i for i, raw in stored.items() if search.payload_matches(raw, (("x", text),))]
        assert await found(broker, TaskFilter(payload=(("x", text),))) == expected, text
