"""Flow control: per-key concurrency and rate limits that every worker honours.

A :class:`Limit` names a key (``"partner:{partner}"`` fills ``{partner}`` from the payload)
and caps how many attempts of that key run at once (``concurrency``) and how many start per
period (``rate="10/s"``). It is resolved at enqueue into a :class:`~durq.task.LimitSpec`
stored with the task, so every worker, whatever code it runs, enforces the same rule; the
broker checks and counts it atomically in the claim. A key counts the tasks of one queue.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from durq.brokers.params import LimitOverride
from durq.errors import ValidationError
from durq.task import MAX_RATE_PER, LimitSpec

#: The most limits one task may carry, and the longest resolved key.
MAX_LIMITS = 8
MAX_KEY = 200
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_PERIOD = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_FORMATTER = string.Formatter()
_COST = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


def parse_rate(rate: str | tuple[int, float]) -> tuple[int, float]:
    """``"10/s"``, ``"600/m"``, ``"5/30s"`` or ``(count, seconds)`` as ``(count, seconds)``."""
    if isinstance(rate, tuple):
        count, per = rate
    else:
        match = _RATE.match(str(rate)) if isinstance(rate, str) else None
        if match is None:
            raise ValidationError(f"invalid rate {rate!r} (examples: '10/s', '600/m', '5/30s')")
        count = int(match.group(1))
        per = float(match.group(2) or 1) * _PERIOD[match.group(3) or "s"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1 or count > 10**9:
        raise ValidationError(f"a rate allows 1 to 10^9 starts per period, got {rate!r}")
    if not isinstance(per, int | float) or not 0.001 <= float(per) <= MAX_RATE_PER:
        raise ValidationError(f"a rate's period is 1 ms to a year, got {rate!r}")
    return count, float(per)


def format_rate(rate: int | None, per: float | None) -> str:
    """A stored rate as it is written in a :class:`Limit`: ``"10/s"``, ``"600/m"``,
    ``"5/30s"``; ``"-"`` for none."""
    if rate is None or per is None:
        return "-"
    for unit in ("d", "h", "m", "s"):
        if per == _PERIOD[unit]:
            return f"{rate}/{unit}"
    if per >= 1:
        return f"{rate}/{per:g}s"
    return f"{rate}/{per * 1000:g}ms"


def _check_concurrency(value: object, lowest: int, what: str) -> None:
    """``None``, or an integer from ``lowest`` to 10^6; ValidationError naming ``what``."""
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not lowest <= value <= 10**6
    ):
        raise ValidationError(f"{what} is an integer from {lowest} to 10^6, got {value!r}")


def format_limit(
    concurrency: int | None, rate: int | None, per: float | None, none: str = "-"
) -> str:
    """A key's limit in one short text: ``"3"`` at most at once, ``"10/s"``, or both
    (``"3, 10/s"``); ``none`` when it has neither."""
    parts = [] if concurrency is None else [str(concurrency)]
    if rate is not None and per is not None:
        parts.append(format_rate(rate, per))
    return ", ".join(parts) or none


@dataclass(frozen=True)
class Limit:
    """A flow-control limit: at most ``concurrency`` attempts of ``key`` run at once across
    every worker, and at most ``rate`` start per period (``"10/s"``, ``"600/m"``).

    ``key`` may name payload fields, ``"partner:{partner}"``, so one task type is limited per
    partner. Give it to ``@app.task(limit=...)`` or to one enqueue (``limit=``); a list gives
    several (a global one and a per-partner one). A task held back stays pending and never
    blocks other keys or task types.

    ``fair=True`` (a key naming payload fields, one such limit per task): the keys filled
    from the template are partitions that take turns. Among the tasks carrying this
    template, a claim starts them round-robin across partitions, so a partner with 100,000
    waiting tasks delays another partner's single task by at most one turn of each.

    ``cost``: how many units of the key one attempt takes, of its concurrency and of its
    tokens (default 1): an int, or a template naming one payload field (``"{pages}"``)
    resolved at enqueue. A task whose cost exceeds the concurrency or the rate could never
    start and is refused at enqueue (ValidationError).

    ``sequence=True``: a strict sequence per key. The key's tasks run one at a time (it
    implies ``concurrency=1``; a greater one is refused), in claim order, and a task keeps
    the key from its first start until it finishes: while it waits for a retry, a snooze, a
    signal, or after its lease expired or its worker handed it back at shutdown, no other
    task of the key starts. The key is free again once the task completes, is archived
    (retries used up, or by the inspector), cancelled or deleted. A rate goes in a limit of
    its own beside it (``[Limit("acct:{a}", sequence=True), Limit("acct-api:{a}",
    rate="5/s")]``): each attempt, retries included, takes a token."""

    key: str
    concurrency: int | None = None
    rate: str | tuple[int, float] | None = None
    fair: bool = False
    cost: int | str = 1
    sequence: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValidationError("a limit needs a key (e.g. 'partner:{partner}')")
        try:
            fields = [f for _, f, _, _ in _FORMATTER.parse(self.key) if f is not None]
        except ValueError as exc:
            raise ValidationError(f"invalid limit key template {self.key!r}: {exc}") from None
        for name in fields:
            if not name.isidentifier():
                raise ValidationError(
                    f"limit key {self.key!r}: {{{name}}} must name one payload field"
                )
        if not isinstance(self.sequence, bool):
            raise ValidationError(f"limit {self.key!r}: sequence is True or False")
        if self.sequence:
            if self.concurrency not in (None, 1) or isinstance(self.concurrency, bool):
                raise ValidationError(
                    f"limit {self.key!r}: a sequence runs one task at a time: concurrency is "
                    f"1 (implied), got {self.concurrency!r}"
                )
            if self.rate is not None:
                # The key's one slot stays with a task between its attempts: a token missing
                # on that same key would hold the task where no slot can ever free up.
                raise ValidationError(
                    f"limit {self.key!r}: a sequence takes no rate of its own; give the rate "
                    "a limit of its own beside it, e.g. [Limit('acct:{account}', "
                    "sequence=True), Limit('acct-api:{account}', rate='5/s')]"
                )
            object.__setattr__(self, "concurrency", 1)
        if self.concurrency is None and self.rate is None:
            raise ValidationError(f"limit {self.key!r} needs concurrency=, rate= or both")
        _check_concurrency(self.concurrency, 1, f"limit {self.key!r}: concurrency")
        if self.rate is not None:
            parse_rate(self.rate)
        if not isinstance(self.fair, bool):
            raise ValidationError(f"limit {self.key!r}: fair is True or False")
        if self.fair and not fields:
            raise ValidationError(
                f"limit {self.key!r}: fair=True needs a key naming payload fields, "
                "whose values are the partitions that take turns (e.g. 'tenant:{tenant}')"
            )
        if self.fair and len(self.key) > MAX_KEY:
            raise ValidationError(f"a fair limit's key template is at most {MAX_KEY} characters")
        if isinstance(self.cost, str):
            if _COST.fullmatch(self.cost) is None:
                raise ValidationError(
                    f"limit {self.key!r}: cost is an integer or one payload field in braces "
                    f"('{{pages}}'), got {self.cost!r}"
                )
        else:
            self._check_cost(self.cost)

    def _check_cost(self, cost: Any) -> int:
        """W24: a cost is an int from 1 up to what the limit allows at once, else no task of
        it could ever start."""
        if not isinstance(cost, int) or isinstance(cost, bool) or not 1 <= cost <= 10**6:
            raise ValidationError(
                f"limit {self.key!r}: cost is an integer from 1 to 10^6, got {cost!r:.60}"
            )
        if self.concurrency is not None and cost > self.concurrency:
            raise ValidationError(
                f"limit {self.key!r}: cost {cost} exceeds its concurrency {self.concurrency}: "
                "such a task could never start"
            )
        if self.rate is not None and cost > parse_rate(self.rate)[0]:
            raise ValidationError(
                f"limit {self.key!r}: cost {cost} exceeds its rate {self.rate!r} (the bucket "
                "never holds that many tokens): such a task could never start"
            )
        return cost

    def resolve(self, payload: Mapping[str, Any]) -> LimitSpec:
        """What one task stores: this limit with the key filled from its payload."""
        key = self.key
        if "{" in key:
            values: dict[str, str] = {}
            for _, name, _, _ in _FORMATTER.parse(key):
                if name is None:
                    continue
                if name not in payload:
                    raise ValidationError(
                        f"limit key {self.key!r} needs payload field {name!r}, which is missing"
                    )
                value = payload[name]
                if isinstance(value, dict | list):
                    raise ValidationError(
                        f"limit key {self.key!r}: payload field {name!r} must be a scalar"
                    )
                values[name] = str(value)
            key = key.format(**values)
        check_key(key)
        rate = per = None
        if self.rate is not None:
            rate, per = parse_rate(self.rate)
        cost = self.cost
        if isinstance(cost, str):
            name = cost[1:-1]
            if name not in payload:
                raise ValidationError(
                    f"limit {self.key!r}: cost {cost!r} needs payload field {name!r}, "
                    "which is missing"
                )
            cost = payload[name]
        return LimitSpec(
            key,
            self.concurrency,
            rate,
            per,
            self.key if self.fair else None,
            self._check_cost(cost),
            self.sequence,
        )


def check_key(key: object) -> str:
    """A resolved limit key (``"partner:acme"``) as the brokers count it: 1 to
    :data:`MAX_KEY` printable characters; ValidationError otherwise."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY or not key.isprintable():
        raise ValidationError(f"a limit key is 1-{MAX_KEY} printable characters, got {key!r:.60}")
    return key


def override(
    queue: str,
    key: str,
    concurrency: int | None = None,
    rate: str | tuple[int, float] | None = None,
) -> LimitOverride:
    """An operator's override of one key's limit (W23), validated: ``concurrency`` 0 to
    10^6 (0 starts none of the key), ``rate`` as :class:`Limit` takes it, at least one;
    a part left ``None`` keeps the limit the key's tasks carry."""
    key = check_key(key)
    if concurrency is None and rate is None:
        raise ValidationError(f"an override of {key!r} needs a concurrency, a rate or both")
    _check_concurrency(concurrency, 0, "an override's concurrency")
    count = per = None
    if rate is not None:
        count, per = parse_rate(rate)
    return LimitOverride(queue, key, concurrency, count, per)


LimitOption = Limit | Iterable[Limit] | None


def as_limits(value: LimitOption) -> tuple[Limit, ...]:
    """``limit=`` as a tuple of :class:`Limit`; ValidationError for anything else."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, Limit) else tuple(value)
    for item in items:
        if not isinstance(item, Limit):
            raise ValidationError(f"limit= takes durq.Limit objects, got {item!r:.60}")
    if len(items) > MAX_LIMITS:
        raise ValidationError(f"a task has at most {MAX_LIMITS} limits, got {len(items)}")
    return items


def resolve_all(limits: tuple[Limit, ...], payload: Any) -> tuple[LimitSpec, ...]:
    """Every limit of one task resolved against its (JSON) payload; one per key, the first
    given wins a repeated key. A fair limit is stored first (the brokers look there)."""
    if not limits:
        return ()
    fields = payload if isinstance(payload, Mapping) else {}
    specs: dict[str, LimitSpec] = {}
    for limit in limits:
        spec = limit.resolve(fields)
        specs.setdefault(spec.key, spec)
    resolved = tuple(specs.values())
    fair = [s for s in resolved if s.fair is not None]
    if not fair:
        return resolved
    if len(fair) > 1:
        raise ValidationError("a task takes turns under one fair limit at most")
    return (fair[0], *(s for s in resolved if s.fair is None))


__all__ = [
    "MAX_KEY",
    "MAX_LIMITS",
    "Limit",
    "LimitOption",
    "as_limits",
    "check_key",
    "format_limit",
    "format_rate",
    "override",
    "parse_rate",
]
