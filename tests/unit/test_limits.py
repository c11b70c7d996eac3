"""durq.Limit: validation at the edge, rates, key templates."""

from __future__ import annotations

import pytest

import durq
from durq.brokers.limiter import Counter, admits, blocking, fresh, take
from durq.errors import ValidationError
from durq.limits import as_limits, parse_rate, resolve_all
from durq.task import LimitSpec, limits_from_json, limits_to_json


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10/s", (10, 1.0)), ("600/m", (600, 60.0)), ("5/30s", (5, 30.0)), ("1/h", (1, 3600.0))],
)
def test_rates(text: str, expected: tuple[int, float]) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["", "10", "0/s", "ten/s", "10/x", "10/0s", "-1/s"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_rate(text)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key": "k"},
        {"key": "", "concurrency": 1},
        {"key": "k", "concurrency": 0},
        {"key": "k", "concurrency": True},
        {"key": "k:{a.b}", "concurrency": 1},
        {"key": "k:{", "concurrency": 1},
        {"key": "k", "rate": "fast"},
    ],
)
def test_bad_limits(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        durq.Limit(**kwargs)  # type: ignore[arg-type]


def test_keys_from_the_payload() -> None:
    limits = as_limits([durq.Limit("all", 5), durq.Limit("p:{partner}:{n}", rate="2/s")])
    specs = resolve_all(limits, {"partner": "acme", "n": 3})
    assert specs == (LimitSpec("all", 5), LimitSpec("p:acme:3", None, 2, 1.0))
    assert limits_from_json(limits_to_json(specs)) == specs
    with pytest.raises(ValidationError, match="scalar"):
        resolve_all(limits, {"partner": {"x": 1}, "n": 1})
    with pytest.raises(ValidationError, match=r"durq\.Limit"):
        as_limits(["k"])  # type: ignore[list-item]


def test_token_bucket() -> None:
    spec = LimitSpec("k", concurrency=2, rate=2, per=1.0)
    counters: dict[str, Counter] = {}
    assert blocking((spec,), counters, 100.0) is None
    c = counters["k"]
    take(spec, c, 100.0)
    take(spec, c, 100.0)
    assert not admits(spec, c, 100.0)  # two running, no token
    c.running = 0
    assert not admits(spec, c, 100.0)  # no token yet
    assert c.next_room_at(100.0) == pytest.approx(100.5)
    assert admits(spec, c, 100.5)
    assert c.room(200.0) == 2  # the bucket holds at most 2
    assert fresh(spec, 0.0).room(0.0) == 2
