"""Retry delay policies. A policy maps ``(retried, exc)`` to seconds."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeAlias

from durq.errors import ConfigurationError

RetryDelay: TypeAlias = Callable[[int, BaseException], float]


def exponential(
    retried: int, exc: BaseException | None = None, *, base: float = 1.0, cap: float = 3600.0
) -> float:
    """Capped exponential with full jitter in the upper half: ``base * 2**n``, at most ``cap``.

    Jitter spreads retries of tasks that failed together (a partner outage) so they do not
    come back as one burst."""
    ceiling = min(cap, base * 2.0 ** min(retried, 62))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def capped_power_of_two(retried: int, exc: BaseException | None = None) -> float:
    """``min(2**n, 300)`` seconds, without jitter: the classic polling schedule."""
    return float(min(2 ** min(retried, 62), 300))


def fixed(seconds: float) -> RetryDelay:
    """A constant delay; handy in tests and for partners with a known retry-after."""

    def policy(retried: int, exc: BaseException) -> float:
        return seconds

    return policy


POLICIES: dict[str, RetryDelay] = {
    "exponential": exponential,
    "capped_power_of_two": capped_power_of_two,
}


def resolve(policy: str | RetryDelay | None) -> RetryDelay:
    """Turn a policy name or callable into a callable."""
    if policy is None:
        return exponential
    if callable(policy):
        return policy
    try:
        return POLICIES[policy]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ConfigurationError(
            f"unknown retry_delay policy {policy!r} (known: {known})"
        ) from None
