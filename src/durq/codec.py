"""JSON encoding of payloads and results. Nothing is ever pickled or evaluated (E6, S1)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from json import encoder as json_encoder
from typing import Any

from durq.errors import PayloadError

#: Default largest encoded payload, in bytes.
DEFAULT_MAX_PAYLOAD = 1024 * 1024
#: Default largest encoded result, in bytes.
DEFAULT_MAX_RESULT = 1024 * 1024
#: The key of an encrypted value's JSON object (see :mod:`durq.encryption`); reserved.
SEALED_MARKER = "durq:encrypted"
#: How every encrypted value's bytes begin.
SEALED_PREFIX = b'{"' + SEALED_MARKER.encode() + b'":"'


def is_sealed(raw: bytes | None) -> bool:
    """Whether stored bytes are an encrypted value (cheap: a prefix test)."""
    return raw is not None and bytes(raw[: len(SEALED_PREFIX)]) == SEALED_PREFIX


_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_canonical = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
)


def to_jsonable(value: Any) -> Any:
    """Turn a typed model (dataclass, pydantic, msgspec) into plain JSON data."""
    if value is None or isinstance(value, dict | list | str | int | float | bool):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)  # pydantic v2
    if callable(dump):
        return dump(mode="json")
    try:  # msgspec structs
        import msgspec

        if isinstance(value, msgspec.Struct):
            return msgspec.to_builtins(value)
    except ImportError:  # pragma: no cover - msgspec is optional
        pass
    return value


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    """Encode a payload as a JSON object; raise :class:`PayloadError` before touching a broker."""
    data = to_jsonable(payload if payload is not None else {})
    if not isinstance(data, dict):
        raise PayloadError(f"payload must be a JSON object, not {type(data).__name__}")
    if SEALED_MARKER in data:  # would read as an encrypted value
        raise PayloadError(f"the payload key {SEALED_MARKER!r} is reserved")
    return _bounded(data, "payload", max_bytes)


def _bounded(data: Any, what: str, max_bytes: int) -> bytes:
    try:
        raw = _encoder.encode(data).encode("utf-8")
    except RecursionError:
        # Nesting deeper than the interpreter's stack: bad input, not a passing failure.
        raise PayloadError(f"{what} is nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from exc
    if len(raw) > max_bytes:
        raise PayloadError(f"{what} is {len(raw)} bytes, over the limit of {max_bytes}")
    return raw


def encode_value(value: Any, what: str, max_bytes: int) -> bytes:
    """Any JSON value (``what`` names it in errors), bounded by ``max_bytes``; PayloadError
    otherwise."""
    return _bounded(to_jsonable(value), what, max_bytes)


def encode_result(result: Any, *, max_bytes: int = DEFAULT_MAX_RESULT) -> bytes | None:
    """Encode a handler's return value; ``None`` stores no result. PayloadError when it is
    not JSON or larger than ``max_bytes``."""
    if result is None:
        return None
    return _bounded(to_jsonable(result), "result", max_bytes)


def storable_text(text: str) -> str:
    """``text`` as every broker can store it: a NUL becomes the four characters ``\\x00``
    (PostgreSQL's ``text`` refuses NUL) and a lone surrogate its ``\\udXXX`` escape (it has
    no UTF-8 form, so no broker can store it); any other text is returned unchanged.

    Applied to what a handler hands the worker as text (its exception's message, a
    ``NotReady``/``SkipRetry`` reason, the traceback) before any broker sees it."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def decode(
    raw: bytes | str | None, *, object_hook: Callable[[dict[str, Any]], Any] | None = None
) -> Any:
    """Decode stored JSON. Raises ``ValueError`` on anything that is not strict JSON.
    ``object_hook``: as :func:`json.loads`'s (durq.encryption opens sealed objects with it)."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        # bytes, bytearray, memoryview; UnicodeDecodeError is a ValueError. bytes.decode is
        # half the cost of str(raw, "utf-8") (1k instructions, counted).
        raw = raw.decode() if type(raw) is bytes else str(raw, "utf-8")
    try:
        if object_hook is None:
            # The scanner alone, for JSON that fills the text (every stored payload): the
            # decoder's own decode adds two whitespace matches and two Python calls. Any
            # other text (whitespace around it, trailing data, not JSON) goes through the
            # decoder, for its result or its error.
            try:
                value, end = _scan(raw, 0)
            except StopIteration:
                return _decoder.decode(raw)
            if end == len(raw):
                return value
            return _decoder.decode(raw)
        return json.loads(raw, parse_constant=_reject_constant, object_hook=object_hook)
    except RecursionError as exc:
        # Deeply nested arrays exhaust the parser's stack: bad data, not a passing failure.
        raise ValueError("JSON is nested too deeply") from exc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# Built once: json.loads with any option builds a decoder per call, which cost the worker
# more than the decoding of a small payload itself.
_decoder = json.JSONDecoder(parse_constant=_reject_constant)
_scan: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]


def decode_payload(raw: bytes | str) -> dict[str, Any]:
    """Decode a stored payload, which must be a JSON object."""
    value = decode(raw)
    if not isinstance(value, dict):
        raise ValueError(f"payload is a JSON {type(value).__name__}, not an object")
    return value


def canonical(data: Any) -> bytes:
    """Canonical JSON (sorted keys, no spaces): equal data gives equal bytes. ``data`` is
    JSON data without cycles (the encoder does not look for them)."""
    return canonical_text(data).encode("utf-8")


def canonical_text(data: Any) -> str:
    """:func:`canonical` as text."""
    if _canonical_once is None:  # pragma: no cover - CPython has the C encoder
        return _canonical.encode(data)
    return "".join(_canonical_once(data, 0))


# The C encoder of _canonical built once (JSONEncoder.encode builds one per call): a Unique
# key's fields in 4k instructions instead of 12k, counted. No markers: the data is acyclic.
_make_encoder: Any = json_encoder.c_make_encoder  # type: ignore[attr-defined]
_canonical_once = (
    None
    if _make_encoder is None
    else _make_encoder(
        None,
        _canonical.default,
        json_encoder.encode_basestring,
        None,
        ":",
        ",",
        True,
        False,
        False,
    )
)


def unique_key(queue: str, task_type: str, payload: bytes) -> str:
    """The uniqueness key of E4: a digest of queue, type and canonical payload."""
    try:
        body = canonical(decode(payload))
    except (ValueError, RecursionError):
        raise PayloadError("payload is nested too deeply to compare for uniqueness") from None
    digest = hashlib.sha256(b"\x00".join([queue.encode(), task_type.encode(), body]))
    return digest.hexdigest()
