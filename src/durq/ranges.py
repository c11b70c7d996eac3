"""Range checks for configuration values: CLI options, broker URL parameters and the
constructor arguments behind them. One place says what a port, a count or a timeout may be:
a finite number within documented bounds (docs/configuration.md), else a
:class:`~durq.errors.ConfigurationError` naming the setting (the CLI's exit code 2).

``nan`` and ``inf`` are refused everywhere: ``nan`` passes every ``<``/``>`` comparison
unnoticed and crashed later ("cannot convert float NaN to integer"), and an infinite interval
or timeout is a hang, not a setting."""

from __future__ import annotations

import contextlib
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
    inside = number > low if above else number >= low
    if not (math.isfinite(number) and inside and number <= high):
        bound = f"> {low:g}" if above else f">= {low:g}"
        raise ConfigurationError(
            f"{name} must be a finite number {bound} and <= {high:g}, got {value!r}"
        )
    return number


def seconds(name: str, value: object, *, high: float = DAY, positive: bool = False) -> float:
    """A duration in seconds (a number, or text such as ``30``, ``10s``, ``1m``): finite,
    ``>= 0`` (``> 0`` when ``positive``) and at most ``high``."""
    number = math.nan
    if isinstance(value, str):
        with contextlib.suppress(ValidationError):  # refused below, with the text as given
            number = durations.parse(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    inside = number > 0 if positive else number >= 0
    if not (math.isfinite(number) and inside and number <= high):
        low = "above 0" if positive else "from 0"
        raise ConfigurationError(
            f"{name} must be a duration {low} to {span(high)} (seconds, or e.g. 10s, 5m), "
            f"got {value!r}"
        )
    return number


def span(seconds: float) -> str:
    """``86400`` as ``1 day``: a bound for people."""
    for unit, size in (("year", 365.25 * DAY), ("day", DAY), ("hour", 3600.0), ("minute", 60.0)):
        count = seconds / size
        if count >= 1 and count.is_integer():
            return f"{count:g} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} seconds"


def port(name: str, value: object, *, any_port: bool = False) -> int:
    """A TCP port, 1 to 65535 (0 too when ``any_port``: the system picks a free one)."""
    return integer(name, value, 0 if any_port else 1, MAX_PORT)
