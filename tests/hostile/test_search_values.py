"""Hostile search values on every broker: a value with a control character or a lone
surrogate is refused before the broker; any other value gets the answer of the rule's model
(:mod:`durq.brokers.search`), so every broker answers alike. Seeded, so a failure repeats."""

from __future__ import annotations

import json
import random
import unicodedata

import pytest

from durq.brokers import open_broker, search
from durq.brokers.base import ClaimParams, EnqueueParams, RetryParams, TaskFilter, TaskSearch
from durq.clock import FakeClock
from durq.errors import ValidationError
from durq.states import TaskState

QUEUE = "search"
ALPHABET = [*"aZé É ßİi'\"%_\\*?.-+eE019", "\x00", "\n", "\t", "\x1b", "\x7f", "\x85", "\ud800"]
ALPHABET += ["🙂", "\u202e", "\u0130", "ǅ", "\ufeff"]


def hostile_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8)))


def number_spellings(rng: random.Random, value: float) -> list[str]:
    """The same double written several ways, and its neighbours."""
    out = [repr(value), json.dumps(value), f"{value:.17e}", f"{value:.25g}"]
    if value.is_integer() and abs(value) < 1e30:
        out.append(str(int(value)))
        out.append(str(int(value) + rng.choice([-1, 1])))
    return [s.replace("inf", "1e999") for s in out]


def refused(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in text)


@pytest.mark.timeout(120)
async def test_hostile_search_values_are_refused_or_answered_as_the_model_says(
    broker_url: str,
) -> None:
    rng = random.Random(20261207)
    numbers = [0.0, -0.0, 1e-07, 1e20, 2.0**53, 2.0**53 + 2, 2.0**64, 0.1, 5e-324, 1.5e308]
    numbers += [rng.uniform(-1e6, 1e6) for _ in range(6)]
    strings = [hostile_text(rng) for _ in range(30)]
    clock = FakeClock()
    broker = open_broker(broker_url, clock=clock)
    await broker.migrate()
    await broker.connect()
    try:
        stored: dict[str, bytes] = {}
        for i, value in enumerate([*numbers, *strings, True, False, None, [1], {"y": 1}]):
            # ensure_ascii: a lone surrogate or a NUL is stored as its escape, as JSON allows.
            stored[f"p{i}"] = json.dumps({"x": value, "n": i}).encode()
        for task_id, raw in stored.items():
            await broker.enqueue(EnqueueParams(id=task_id, queue=QUEUE, type="t", payload=raw))
        errors = {f"e{i}": text for i, text in enumerate(strings[:12])}
        for task_id, text in errors.items():
            await broker.enqueue(EnqueueParams(id=task_id, queue="errors", type="t", payload=b"{}"))
            (lease,) = await broker.claim(ClaimParams(["errors"], 1, "w1", 60.0))
            storable = "".join(c for c in text if c != "\x00" and not "\ud800" <= c <= "\udfff")
            await broker.retry(RetryParams(lease.ref, storable, clock.now() + 3600))

        wanted = [*strings, *(hostile_text(rng) for _ in range(40)), "true", "false", "null"]
        for value in numbers:
            wanted += number_spellings(rng, value)
        checked = 0
        for text in wanted:
            if refused(text):
                with pytest.raises(ValidationError, match="control characters"):
                    TaskFilter(payload=(("x", text),))
                with pytest.raises(ValidationError, match="control characters"):
                    TaskFilter(error=text)
                continue
            where = TaskFilter(payload=(("x", text),))
            result = await broker.admin.search_tasks(
                TaskSearch(QUEUE, TaskState.PENDING, where, 100)
            )
            expected = {
                i for i, raw in stored.items() if search.payload_matches(raw, where.payload)
            }
            assert {t.id for t in result.tasks} == expected, repr(text)
            where = TaskFilter(error=text)
            result = await broker.admin.search_tasks(
                TaskSearch("errors", TaskState.RETRY, where, 100)
            )
            infos = [await broker.admin.get_task("errors", i) for i in errors]
            expected = {t.id for t in infos if search.error_matches(t.last_error, text)}
            assert {t.id for t in result.tasks} == expected, repr(text)
            checked += 1
        assert checked > 60
    finally:
        await broker.close()
