"""Decoding of task hashes (as HGETALL returns them) into :class:`~durq.task.TaskInfo`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from durq.brokers.limiter import Counter
from durq.brokers.views import TaskOutcome
from durq.clock import to_datetime
from durq.progress import decode_logs, progress_of
from durq.states import FINISHED, TaskState
from durq.steps import decode_steps
from durq.task import TaskInfo, limits_from_json, make_info


def pairs(flat: Sequence[Any] | dict[Any, Any]) -> dict[str, bytes]:
    """A flat ``[field, value, ...]`` reply (or an HGETALL dict) as ``{field: value}``."""
    if isinstance(flat, dict):
        return {_text(k): v for k, v in flat.items()}
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _chunks(h: dict[str, bytes], tag: str) -> bytes | None:
    """Join a value stored as ``<tag>:0``, ``<tag>:1``, ... (see scripts/_lib.lua)."""
    if f"{tag}:0" not in h:
        return None
    parts: list[bytes] = []
    n = 0
    while (part := h.get(f"{tag}:{n}")) is not None:
        parts.append(bytes(part))
        n += 1
    return b"".join(parts)


def _opt_str(h: dict[str, bytes], name: str) -> str | None:
    value = h.get(name)
    return None if value is None else _text(value)


def _opt_float(h: dict[str, bytes], name: str) -> float | None:
    value = h.get(name)
    return None if value is None or value == b"" else float(value)


def task_info(queue: str, flat: Sequence[Any] | dict[Any, Any]) -> TaskInfo:
    """Build the TaskInfo of one task hash of ``queue``."""
    h = pairs(flat)
    headers_raw = _chunks(h, "h")
    headers: dict[str, str] = json.loads(headers_raw) if headers_raw else {}
    state, retried = TaskState(_text(h["state"])), int(h.get("retried", 0))
    return make_info(
        id=_text(h["id"]),
        queue=queue,
        type=_text(h["type"]),
        raw_payload=_chunks(h, "p") or b"",
        state=state,
        max_retry=int(h["max_retry"]),
        retried=retried,
        last_error=_opt_str(h, "last_error"),
        timeout=_opt_float(h, "timeout"),
        deadline=to_datetime(_opt_float(h, "deadline")),
        next_process_at=to_datetime(_opt_float(h, "npa")),
        enqueued_at=to_datetime(_opt_float(h, "enqueued_at")),
        completed_at=to_datetime(_opt_float(h, "completed_at")),
        raw_result=_chunks(h, "r"),
        retention=float(h.get("retention", 0.0)),
        lost=int(h.get("lost", 0)),
        headers=headers,
        started_at=to_datetime(_opt_float(h, "started_at")),
        lease_expires_at=to_datetime(_opt_float(h, "lease_expires_at")),
        worker_id=_opt_str(h, "worker_id"),
        cancel_requested=h.get("cancel") == b"1",
        traceback=_opt_str(h, "traceback") or None,
        priority=int(h.get("prio", 0)),
        limits=limits_from_json(h.get("L")),
        held_by=_opt_str(h, "held_by"),
        progress=progress_of(h.get("progress"), state, retried),
        logs=decode_logs(h.get("logs")),
        steps=decode_steps(h.get("steps")),
        snoozes=int(h.get("snoozes", 0)),
        # Kept in the hash after the key is let go at the end: shown while unfinished.
        unique_until=None if state in FINISHED else to_datetime(_opt_float(h, "uu")),
    )


def task_outcome(flat: Sequence[Any] | dict[Any, Any]) -> TaskOutcome:
    """What ``Admin.get_outcomes`` reads of one task hash (its dependents' view)."""
    h = pairs(flat)
    headers_raw = _chunks(h, "h")
    return TaskOutcome(
        id=_text(h["id"]),
        state=TaskState(_text(h["state"])),
        raw_result=_chunks(h, "r"),
        last_error=_opt_str(h, "last_error"),
        headers=json.loads(headers_raw) if headers_raw else {},
    )


def stored_counter(raw: bytes) -> Counter:
    """A limit key's counter as ``claim.lua`` stores it:
    ``running|concurrency|rate|per|tokens|refilled_at|need|o_concurrency|o_rate|o_per``
    (empty for none; ``need`` absent in counters written before W24, the override's three
    in those written before W23)."""
    running, concurrency, rate, per, tokens, at, *rest = raw.decode().split("|")
    need, o_concurrency, o_rate, o_per = (*rest, "", "", "", "")[:4]
    return Counter(
        running=int(running),
        concurrency=int(concurrency) if concurrency else None,
        rate=int(float(rate)) if rate else None,
        per=float(per) if per else None,
        tokens=float(tokens),
        refilled_at=float(at),
        need=int(need) if need else 1,
        override_concurrency=int(float(o_concurrency)) if o_concurrency else None,
        override_rate=int(float(o_rate)) if o_rate else None,
        override_per=float(o_per) if o_per else None,
    )
