"""Durable steps of a task (``await ctx.step("charge", charge_card, order_id)``): what a
handler records, and the stored form every broker keeps.

A step runs its function once: its JSON result is stored on the task, under the attempt's
lease, before the handler goes on; when the task runs again (a retry, a rescued lease, a
redeploy) a step already recorded returns its stored result without running. Steps are
matched by name: one name at most once per attempt (:class:`~durq.errors.StepError`
otherwise); a recorded step the handler no longer reaches is left unused.

A durable sleep (``await ctx.sleep("cool-off", 3600)``) is a step too: its record holds the
moment it ends, ``{"durq.sleep": {"until": …, "count": …}}`` (``count``: how often the task
left the worker for it, more than once when it was run before its time), so a task run again
after a sleep returns from it at once, and one woken early sleeps the rest.

Stored form (the same on every broker): one JSON object, ``{name: {"result": …, "started":
…, "ended": …, "attempt": …}}`` in the order the steps were first recorded. The worker
appends each new step to the text (:func:`append`) and writes the whole text back; a broker
stores it as opaque text."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quoted
from typing import Any

from durq.clock import to_datetime
from durq.errors import StepError

#: Longest step name, in characters.
MAX_NAME = 200
#: The key of a durable sleep's record (its step result).
SLEEP = "durq.sleep"
#: The key of a wait for a signal's record (``ctx.wait_for``).
WAIT = "durq.wait"
#: A signal's name: letters, digits and ``_ . : -``, at most 100 characters.
SIGNAL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


@dataclass(frozen=True, slots=True)
class TaskStep:
    """One recorded step of a task."""

    name: str
    #: The step function's result, decoded from its stored JSON.
    result: Any
    #: When it started and ended (epoch seconds on the worker app's clock).
    started: float
    ended: float
    #: The attempt that ran it (1 for the first).
    attempt: int

    @property
    def sleep_until(self) -> float | None:
        """When a durable sleep ends (epoch seconds); ``None`` for a step."""
        found = sleep_record(self.result)
        return None if found is None else found[0]

    @property
    def kind(self) -> str:
        """``"step"``, ``"sleep"`` (``ctx.sleep``) or ``"wait"`` (``ctx.wait_for``)."""
        if sleep_record(self.result) is not None:
            return "sleep"
        return "wait" if wait_record(self.result) is not None else "step"

    @property
    def detail(self) -> str:
        """What a sleep or a wait is at (empty for a step): ``until 2026-…``, ``received``,
        ``timed out``."""
        until = self.sleep_until
        if until is not None:
            return f"until {_iso(until)}"
        wait = wait_record(self.result)
        if wait is None:
            return ""
        if "received" in wait:
            return "received"
        if wait.get("timed_out"):
            return "timed out"
        return f"waits until {_iso(float(wait['until']))}"

    @property
    def duration(self) -> float:
        """Seconds the step function ran."""
        return max(0.0, self.ended - self.started)

    def describe(self) -> str:
        """``charge 0.120s (attempt 1)``: the step in one line (a sleep: ``cool-off sleeps
        until 2026-12-07T12:00:00+00:00 (attempt 1)``)."""
        if self.kind == "sleep":
            return f"{self.name} sleeps {self.detail} (attempt {self.attempt})"
        if self.kind == "wait":
            return f"{self.name} signal {self.detail} (attempt {self.attempt})"
        return f"{self.name} {self.duration:.3f}s (attempt {self.attempt})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "result": self.result,
            "started": _iso(self.started),
            "ended": _iso(self.ended),
            "duration": self.duration,
            "attempt": self.attempt,
            "sleep_until": None if self.sleep_until is None else _iso(self.sleep_until),
        }


def _iso(at: float) -> str | None:
    moment = to_datetime(at)
    return moment.isoformat() if moment else None


def check_name(name: str) -> str:
    """``name`` if it can name a step (a non-empty string of at most :data:`MAX_NAME`
    characters); StepError otherwise."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise StepError(f"a step name is a non-empty string of at most {MAX_NAME} characters")
    return name


def encode_result(name: str, value: Any) -> str:
    """``value`` as JSON text; StepError when it is not JSON (a step's result is stored)."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StepError(f"step {name!r}: its result must be JSON ({exc})") from None


def decode(raw: str | bytes | None) -> dict[str, dict[str, Any]]:
    """The stored steps as ``{name: entry}`` (``None``, empty: none)."""
    if not raw:
        return {}
    data = json.loads(raw)
    return dict(data) if isinstance(data, dict) else {}


def encode(entries: dict[str, dict[str, Any]]) -> str:
    """The stored form of ``entries``."""
    return json.dumps(entries, separators=(",", ":"))


def append(stored: str, name: str, text: str, started: float, ended: float, attempt: int) -> str:
    """``stored`` (the stored form, ``"{}"`` for none) with one more step, whose result is the
    JSON ``text``, after the others: what :func:`encode` writes for them all, built without
    encoding the others again or decoding ``text``. ``name`` must not be in ``stored``."""
    # json.dumps' own pieces (a call of json.dumps each cost as much as the whole encode).
    number = float.__repr__
    entry = (
        f'{_quoted(name)}:{{"result":{text},"started":{number(float(started))},'
        f'"ended":{number(float(ended))},"attempt":{int(attempt)}}}}}'
    )
    return f"{stored[:-1]},{entry}" if len(stored) > 2 else f"{{{entry}"


def decode_steps(raw: str | bytes | None) -> tuple[TaskStep, ...]:
    """The stored steps, in the order they were first recorded."""
    if not raw:  # most tasks: every enqueue, claim and read builds this
        return ()
    return tuple(
        TaskStep(
            name,
            e.get("result"),
            float(e.get("started", 0.0)),
            float(e.get("ended", 0.0)),
            int(e.get("attempt", 0)),
        )
        for name, e in decode(raw).items()
    )


def entries(steps: Sequence[TaskStep]) -> dict[str, dict[str, Any]]:
    """``{name: entry}`` of decoded steps, as :func:`decode` gives them from the stored
    form (a claim returns a task's steps decoded)."""
    return {
        step.name: {
            "result": step.result,
            "started": step.started,
            "ended": step.ended,
            "attempt": step.attempt,
        }
        for step in steps
    }


def json_value(text: str) -> Any:
    """The value of JSON ``text`` (what a later attempt gets back, not the object returned)."""
    return json.loads(text)


def sleep_record(result: Any) -> tuple[float, int] | None:
    """``(until, count)`` of a recorded durable sleep's result; ``None`` for a step's."""
    if not isinstance(result, dict) or set(result) != {SLEEP}:
        return None
    body = result[SLEEP]
    try:
        return float(body["until"]), int(body.get("count", 1))
    except (TypeError, KeyError, ValueError):
        return None


def sleep_text(until: float, count: int) -> str:
    """The JSON text recorded for a durable sleep ending at ``until``."""
    return json.dumps({SLEEP: {"until": until, "count": count}}, separators=(",", ":"))


def wait_record(result: Any) -> dict[str, Any] | None:
    """The body of a recorded wait for a signal: ``until``, ``count``, and ``received`` (the
    signal's payload) or ``timed_out`` once it ended; ``None`` for anything else."""
    if not isinstance(result, dict) or set(result) != {WAIT}:
        return None
    body = result[WAIT]
    return body if isinstance(body, dict) and "until" in body else None


def wait_text(until: float, count: int, **ended: Any) -> str:
    """The JSON text recorded for a wait for a signal (``received=...`` or
    ``timed_out=True`` once it ended)."""
    return json.dumps({WAIT: {"until": until, "count": count, **ended}}, separators=(",", ":"))


def check_signal_name(name: str) -> str:
    """``name`` if it can name a signal; StepError otherwise."""
    if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
        raise StepError(
            f"a signal name is 1-100 letters, digits, '_', '.', ':' or '-', not {name!r}"
        )
    return name


def sleeps_in(raw: str | bytes | None) -> int:
    """How often a task left the worker to sleep or to wait for a signal, from its stored
    steps (a task's ``snoozes`` counter counts these too; ``max_snoozes`` bounds the rest)."""
    total = 0
    for entry in decode(raw).values():
        result = entry.get("result")
        found = sleep_record(result)
        if found is not None:
            total += found[1]
        elif (wait := wait_record(result)) is not None:
            total += int(wait.get("count", 0))
    return total
