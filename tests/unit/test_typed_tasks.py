"""Typed task definitions: mypy checks what a handler's annotations promise (payload and
result), and dataclass payloads are validated as strictly as pydantic or msgspec models."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
from mypy import api as mypy_api
from pydantic import BaseModel

import durq
from durq.payloads import validate

SNIPPET = """
    import dataclasses
    import durq

    app = durq.App("sqlite:///:memory:")

    @dataclasses.dataclass
    class Order:
        user_id: int

    @dataclasses.dataclass
    class Receipt:
        total: int

    @app.task("orders:charge")
    async def charge(payload: Order, ctx: durq.TaskContext) -> Receipt:
        return Receipt(total=payload.user_id)

    @app.task("orders:sync")
    def sync_charge(payload: Order) -> int:
        return payload.user_id

    reveal_type(charge)
    reveal_type(sync_charge)

    async def web() -> None:
        info = await charge.enqueue(Order(user_id=1))
        await charge.enqueue(123)
        charge.enqueue_sync("x")
        reveal_type(await charge.wait(info))
        reveal_type(sync_charge.wait_sync(info.id))
"""


def run_mypy(tmp_path: Path, source: str) -> list[str]:
    module = tmp_path / "snippet.py"
    module.write_text(textwrap.dedent(source))
    # Where durq's sources are: an editable install is an import hook that mypy cannot follow.
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {Path(durq.__file__).parents[1]}\n")
    # mypy raises the interpreter's recursion limit for good (to 2**14): put it back, or a
    # later test in this process encodes payloads nested deeper than a worker could.
    limit = sys.getrecursionlimit()
    try:
        out, err, _ = mypy_api.run(
            [
                "--config-file",
                str(config),
                "--strict",
                "--allow-untyped-defs",
                "--allow-incomplete-defs",
                "--no-error-summary",
                "--follow-imports=silent",
                "--cache-dir",
                str(tmp_path / ".mypy_cache"),
                str(module),
            ]
        )
    finally:
        sys.setrecursionlimit(limit)
    assert not err, err
    return out.splitlines()


def test_handler_annotations_type_the_task_and_its_enqueue(tmp_path: Path) -> None:
    lines = run_mypy(tmp_path, SNIPPET)
    revealed = [line for line in lines if "Revealed type" in line]
    assert "durq.taskdef.TaskDef[snippet.Order, snippet.Receipt]" in revealed[0]
    assert "durq.taskdef.TaskDef[snippet.Order, int]" in revealed[1]
    # The awaited result is the handler's return type.
    assert '"snippet.Receipt"' in revealed[2] and 'is "int"' in revealed[3]
    errors = [line for line in lines if ": error:" in line]
    assert len(errors) == 2, lines
    assert '"enqueue" of "TaskDef"' in errors[0] and '"int"' in errors[0]
    assert '"enqueue_sync" of "TaskDef"' in errors[1] and '"str"' in errors[1]


@dataclasses.dataclass
class Signup:
    user_id: int
    email: str
    plan: str = "free"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"user_id": "x", "email": "a@b.c"}, "Expected `int`, got `str`"),
        ({"user_id": True, "email": "a@b.c"}, "Expected `int`, got `bool`"),
        ({"user_id": 1}, "missing required field `email`"),
        ({"user_id": 1, "email": "a@b.c", "admin": True}, "unexpected field 'admin'"),
    ],
)
def test_dataclass_payloads_are_validated_strictly(payload: dict[str, object], reason: str) -> None:
    with pytest.raises(durq.PayloadError, match=reason):
        validate(Signup, payload)


def test_dataclass_payloads_keep_defaults_and_accept_instances() -> None:
    assert validate(Signup, {"user_id": 7, "email": "a@b.c"})["plan"] == "free"
    assert validate(Signup, Signup(1, "a@b.c", "pro")) == {
        "user_id": 1,
        "email": "a@b.c",
        "plan": "pro",
    }


class PydanticSignup(BaseModel):
    user_id: int
    at: datetime | None = None


@pytest.mark.parametrize("user_id", ["7", True, 7.5])
def test_pydantic_payloads_are_as_strict_as_dataclasses(user_id: object) -> None:
    """E6: one strictness for every kind of model."""
    with pytest.raises(durq.PayloadError, match="user_id: Input should be a valid integer"):
        validate(PydanticSignup, {"user_id": user_id})
    with pytest.raises(durq.PayloadError, match="user_id"):
        validate(Signup, {"user_id": user_id, "email": "a@b.c"})


def test_pydantic_payloads_take_the_json_forms_of_values() -> None:
    data = validate(PydanticSignup, {"user_id": 7, "at": "2031-05-17T08:09:10Z"})
    assert data == {"user_id": 7, "at": "2031-05-17T08:09:10Z"}
