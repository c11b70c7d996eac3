"""Durations: seconds, ``timedelta`` or strings such as ``30s``, ``5m``, ``1h30m``, ``2d``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from durq.errors import ValidationError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
#: The longest duration durq accepts (100 years): any moment it adds up to stays within
#: what every broker and ``datetime`` can hold.
MAX_DURATION = 100 * 365.25 * 86400

#: A duration as durq's options take it: seconds, a ``timedelta`` or a string.
Duration = float | int | timedelta | str

_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(value: float | int | timedelta | str | None) -> float | None:
    """Normalise a duration to seconds; ``None`` stays ``None``. ValidationError for
    anything negative, not finite or longer than :data:`MAX_DURATION`."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        try:
            result = value.total_seconds()
        except OverflowError:
            raise ValidationError(f"invalid duration {value!r}") from None
    elif isinstance(value, bool):
        raise ValidationError(f"invalid duration {value!r}")
    elif isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        result = parse(value)
    else:
        raise ValidationError(f"invalid duration {value!r}")
    if not math.isfinite(result) or result < 0:
        raise ValidationError(f"duration must be a finite number >= 0, got {value!r:.40}")
    if result > MAX_DURATION:
        raise ValidationError(f"duration must be at most 100 years, got {value!r:.40}")
    return result


def parse(text: str) -> float:
    """Parse ``"90"``, ``"30s"``, ``"1h30m"`` into seconds."""
    s = text.strip().lower()
    try:
        return float(s)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT[match.group(2)]
        pos = match.end()
    if pos != len(s) or not s:
        raise ValidationError(f"invalid duration {text!r} (examples: 30, 30s, 5m, 1h30m, 2d)")
    return total
