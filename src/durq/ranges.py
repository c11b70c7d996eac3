"""Range checks for configuration values: CLI options, broker URL parameters and the
constructor arguments behind them. One place says what a port, a count or a timeout may be:
a finite number within documented bounds (docs/configuration.md), else a
:class:`~durq.errors.ConfigurationError` naming the setting (the CLI's exit code 2).

``nan`` and ``inf`` are refused everywhere: ``nan`` passes every ``<``/``>`` comparison
unnoticed and crashed later ("cannot convert float NaN to integer"), and an infinite interval
or timeout is a hang, not a setting."""

from __future__ import annotations

import math

from durq import durations
from durq.errors import ConfigurationError, ValidationError

#: Longest timeout or interval a setting may hold (a day): longer is a typo, not a plan.
DAY = 86400.0
#: The highest TCP port.
MAX_PORT = 65535


def integer(name: str, value: object, low: int, high: int) -> int:
    """``value`` (an int or its decimal text) as an int from ``low`` to ``high``."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        number = int(value)
    if number is None or not low <= number <= high:
        raise ConfigurationError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return number


def real(name: str, value: object, low: float, high: float, *, above: bool = False) -> float:
    """``value`` (a number or its text) as a finite float from ``low`` (exclusive when
    ``above``) to ``high``."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan  # refused below, with the value as given
    return _within(name, number, low, high, above=above, given=value)


def seconds(name: str, value: object, *, high: float = DAY, positive: bool = False) -> float:
    """A duration in seconds (a number, or text such as ``30``, ``10s``, ``1m``): finite,
    ``>= 0`` (``> 0`` when ``positive``) and at most ``high``."""
    if not isinstance(value, str):
        return real(name, value, 0.0, high, above=positive)
    try:
        number = durations.parse(value)
    except ValidationError:
        raise ConfigurationError(
            f"{name} must be a duration such as 30, 10s or 1m, got {value!r}"
        ) from None
    return _within(name, number, 0.0, high, above=positive, given=value)


def _within(
    name: str, number: float, low: float, high: float, *, above: bool, given: object
) -> float:
    inside = number > low if above else number >= low
    if not (math.isfinite(number) and inside and number <= high):
        bound = f"> {low:g}" if above else f">= {low:g}"
        raise ConfigurationError(
            f"{name} must be a finite number {bound} and <= {high:g}, got {given!r}"
        )
    return number


def port(name: str, value: object, *, any_port: bool = False) -> int:
    """A TCP port, 1 to 65535 (0 too when ``any_port``: the system picks a free one)."""
    return integer(name, value, 0 if any_port else 1, MAX_PORT)
