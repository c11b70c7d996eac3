"""Typed payloads: a handler annotated with a dataclass, pydantic or msgspec model gets that
model, validated at enqueue time (E6) and rebuilt from JSON at run time."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from durq.codec import to_jsonable
from durq.errors import PayloadError, ValidationError
from durq.task import TaskContext


@dataclasses.dataclass(frozen=True)
class HandlerShape:
    """What the worker needs to know to call a handler."""

    model: type | None
    wants_context: bool
    takes_payload: bool
    #: The return annotation when it is a model: a waited result is rebuilt into it.
    result_model: type | None = None


def inspect_handler(fn: Callable[..., Any]) -> HandlerShape:
    """Read the handler's signature: ``(payload[: Model][, ctx: TaskContext])``."""
    params = list(inspect.signature(fn).parameters.values())
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolved forward references: treat as untyped
        hints = {}
    model: type | None = None
    wants_context = False
    takes_payload = False
    for index, param in enumerate(params[:2]):
        hint = hints.get(param.name)
        if hint is TaskContext or param.name == "ctx":
            wants_context = True
        elif index == 0:
            takes_payload = True
            if isinstance(hint, type) and is_model(hint):
                model = hint
    returns = hints.get("return")
    result_model = returns if isinstance(returns, type) and is_model(returns) else None
    return HandlerShape(model, wants_context, takes_payload, result_model)


def is_model(tp: type) -> bool:
    """True for dataclasses, pydantic models and msgspec structs."""
    if dataclasses.is_dataclass(tp):
        return True
    if hasattr(tp, "model_validate"):
        return True
    return hasattr(tp, "__struct_fields__")


#: Where msgspec says a value was refused: ``... - at `$.items[1].sku```.
_MSGSPEC_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>.*)`$")


def problems(exc: BaseException) -> list[dict[str, Any]]:
    """What a validator refused, as ``[{"type", "loc", "msg"}]`` (``loc``: the field's path
    in the payload): pydantic's own errors, or msgspec's message and path."""
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic; the refused values are left out of what is shown
        try:
            found = errors(include_url=False, include_input=False)
        except TypeError:
            found = None
        if isinstance(found, list) and found:
            return [{"type": e["type"], "loc": list(e["loc"]), "msg": e["msg"]} for e in found]
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    at = _MSGSPEC_AT.match(text)
    if at is None:
        return [{"type": "payload_error", "loc": [], "msg": text}]
    loc: list[str | int] = [
        name or int(index) for name, index in re.findall(r"\.(\w+)|\[(\d+)\]", at["path"])
    ]
    return [{"type": "payload_error", "loc": loc, "msg": at["msg"]}]


def build(model: type, data: Any) -> Any:
    """Validate plain data into ``model``; raise PayloadError with the validator's reason
    (and its ``problems`` in the error's context, for a 422 answer)."""
    if isinstance(data, model):
        return data
    if not isinstance(data, dict):
        raise PayloadError(f"payload for {model.__name__} must be an object")
    try:
        if hasattr(model, "model_validate_json"):
            # Strict as the other two: "7" is no int, True no int. Payloads are JSON data,
            # so the JSON rules apply: an ISO string is a datetime, a list a tuple.
            return model.model_validate_json(json.dumps(data), strict=True)  # type: ignore[attr-defined]
        if dataclasses.is_dataclass(model):
            # msgspec checks the field types as strictly as pydantic does ("x" is no int);
            # it ignores unknown keys, which the dataclass constructor used to refuse.
            unknown = sorted(data.keys() - {f.name for f in dataclasses.fields(model)})
            if unknown:
                raise PayloadError(
                    f"invalid payload for {model.__name__}: unexpected field {unknown[0]!r}",
                    problems=[
                        {"type": "extra_forbidden", "loc": [unknown[0]], "msg": "unexpected field"}
                    ],
                )
        return msgspec.convert(data, model)
    except PayloadError:
        raise
    except Exception as exc:  # each library has its own ValidationError
        found = problems(exc)
        first = found[0]
        where = ".".join(str(part) for part in first["loc"])
        reason = f"{where}: {first['msg']}" if where else first["msg"]
        raise PayloadError(
            f"invalid payload for {model.__name__}: {reason}", problems=found
        ) from exc


def rebuild_result(model: type | None, data: Any) -> Any:
    """A stored result (plain JSON data) as the handler's return model, if it has one."""
    if model is None or data is None or isinstance(data, model):
        return data
    try:
        validate = getattr(model, "model_validate", None)
        return validate(data) if validate is not None else msgspec.convert(data, model)
    except Exception as exc:  # each library has its own ValidationError
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValidationError(f"the stored result does not fit {model.__name__}: {reason}") from exc


def validate(model: type | None, payload: Any) -> Any:
    """Payload as plain JSON data, validated against ``model`` when there is one."""
    if model is None:
        return to_jsonable(payload)
    return to_jsonable(build(model, to_jsonable(payload) if payload is not None else {}))
