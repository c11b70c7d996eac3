"""What a search of the inspector means, once, so that every broker answers it the same.

* **Search text** (the error text, payload values, the type) holds no control character
  (``\\x00``-``\\x1f``, ``\\x7f``-``\\x9f``) and no lone surrogate: ValidationError before any
  broker (no database can store a NUL in text, and each one would answer differently).
* **Error text** is found as a substring of the last error, **ASCII case-insensitive**:
  ``A``-``Z`` equal ``a``-``z``, every other character only itself (``É`` is not ``é``), the
  one rule every storage can apply exactly.
* **A payload value** is found at a dotted path through JSON objects only (``items.0`` never
  indexes an array). A string matches its exact text; ``true``/``false`` the booleans; a
  number matches when the search text is a JSON number (``7``, ``-0.5``, ``1e-07``) with the
  same value as a double: ``7`` finds ``7`` and ``7.0``, ``-0`` finds ``0``, ``1e20`` finds
  ``100000000000000000000``, and past 2^53 neighbouring integers that round to the same
  double match each other (``9007199254740993`` finds ``9007199254740992``). Null, arrays,
  objects, numbers beyond the double range, and payloads that are not strict JSON (or hold a
  NUL or a lone surrogate in a string: PostgreSQL's JSON cannot) match nothing.

PostgreSQL applies the number rule in SQL with the bounds of :func:`number_bounds` (the
exact decimal interval that rounds to the double); SQLite, Redis and the memory broker call
:func:`payload_matches` and :func:`error_matches`.
"""

from __future__ import annotations

import json
import math
import re
import struct
import unicodedata
from decimal import Context, Decimal
from fractions import Fraction
from typing import Any

from durq.errors import ValidationError

#: A JSON number, as RFC 8259 writes it.
JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def check_text(what: str, text: str) -> str:
    """``text`` if it holds no control character or lone surrogate, else ValidationError."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise ValidationError(
                f"{what} must not contain control characters or lone surrogates "
                f"(found U+{ord(ch):04X})"
            )
    return text


def ascii_lower(text: str) -> str:
    """``text`` with ``A``-``Z`` lowered and nothing else changed."""
    return text.translate(_ASCII_LOWER)


def error_matches(last_error: str | None, wanted: str) -> bool:
    """Whether ``wanted`` is in ``last_error``, ASCII case-insensitive."""
    return last_error is not None and ascii_lower(wanted) in ascii_lower(last_error)


def search_number(text: str) -> float | None:
    """The double a search text means as a number: a finite JSON number, else ``None``."""
    if not JSON_NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def number_bounds(value: float) -> tuple[str, str, bool]:
    """``(low, high, inclusive)``: the decimal numbers that round to ``value`` as a double
    lie between ``low`` and ``high``, the bounds included when ``inclusive`` (a tie rounds to
    the even significand). Exact decimal strings, for PostgreSQL's ``numeric``."""
    below = math.nextafter(value, -math.inf)
    above = math.nextafter(value, math.inf)
    exact = Fraction(value)
    low = (
        (Fraction(below) + exact) / 2
        if math.isfinite(below)
        else exact - (Fraction(above) - exact) / 2
    )
    high = (
        (Fraction(above) + exact) / 2
        if math.isfinite(above)
        else exact + (exact - Fraction(below)) / 2
    )
    even = struct.unpack("<q", struct.pack("<d", value))[0] % 2 == 0
    return _decimal(low), _decimal(high), even


def sql_pair(path: str, text: str) -> list[Any]:
    """One payload condition as PostgreSQL takes it: ``[jsonpath, text, bounds]``, the path
    strict (``strict $."customer"."id"``: an array on the way is no match), the bounds
    (:func:`number_bounds`) ``None`` when the text is no number. Field names are checked
    (``PAYLOAD_FIELD``), so quoting each one is enough."""
    number = search_number(text)
    steps = "".join(f'."{key}"' for key in path.split("."))
    return [f"strict ${steps}", text, None if number is None else list(number_bounds(number))]


def _decimal(value: Fraction) -> str:
    # A dyadic fraction: its decimal form ends; 2,000 digits hold every double's midpoint.
    context = Context(prec=2000)
    return str(context.divide(Decimal(value.numerator), Decimal(value.denominator)))


def _unsearchable(_: str) -> Any:
    raise ValueError("not strict JSON")


def _check_strings(value: Any) -> None:
    """ValueError when a string (key or value) holds a NUL or a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            items: list[Any] = [item]
        elif isinstance(item, dict):
            items = [*item.keys()]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for text in items:
            if "\x00" in text or any("\ud800" <= ch <= "\udfff" for ch in text):
                raise ValueError("not storable JSON")


# Escapes that decode to what PostgreSQL's JSON refuses (NUL, surrogates): only a payload
# holding one needs the walk over its strings.
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def decode_payload(raw: bytes | str) -> Any:
    """The payload as a search reads it, or ValueError."""
    data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    text = data.decode("utf-8")
    try:
        try:
            value = json.loads(text, parse_constant=_unsearchable)
        except ValueError as exc:
            if "integer string conversion" not in str(exc):
                raise
            # An integer of more than 4,300 digits: Python's limit, not JSON's.
            value = json.loads(text, parse_int=float, parse_constant=_unsearchable)
    except RecursionError as exc:
        raise ValueError("JSON is nested too deeply") from exc
    if _SUSPECT_ESCAPE.search(data):
        _check_strings(value)
    return value


def value_matches(value: Any, wanted: str) -> bool:
    """Whether one payload value (decoded by :func:`decode_payload`) matches ``wanted``."""
    if isinstance(value, str):
        return value == wanted
    if isinstance(value, bool):
        return wanted == ("true" if value else "false")
    if isinstance(value, int | float):
        number = search_number(wanted)
        try:
            return number is not None and float(value) == number
        except OverflowError:  # an integer beyond the doubles
            return False
    return False


def payload_matches(raw: bytes | str | None, pairs: tuple[tuple[str, str], ...]) -> bool:
    """Whether every ``(dotted path, text)`` pair matches the payload ``raw``."""
    if not pairs:
        return True
    if raw is None:
        return False
    try:
        payload = decode_payload(raw)
    except ValueError:
        return False
    for path, wanted in pairs:
        value = payload
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if not value_matches(value, wanted):
            return False
    return True
