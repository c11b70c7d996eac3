"""The stored form of durable steps: a step appended to the stored text is what encoding all
the steps again would write (the worker appends instead of encoding them all on each step)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durq import steps as s


@pytest.mark.parametrize(
    "result",
    [None, 1, 2.5, 'é " \\ \n', [1, {"a": None}], {"nested": {"k": [True, False]}}],
)
@pytest.mark.parametrize("before", [{}, {"a": 1}, {"é": "x", "b": [1, 2]}])
def test_an_appended_step_is_stored_as_encode_writes_it(
    result: Any, before: dict[str, Any]
) -> None:
    entries = {
        name: {"result": value, "started": 1.0, "ended": 2.25, "attempt": 1}
        for name, value in before.items()
    }
    text = s.encode_result('new "step" ü', result)
    stored = s.append(s.encode(entries), 'new "step" ü', text, 1765000000.123456, 1765000000.5, 3)
    entries["new \"step\" ü"] = {
        "result": result, "started": 1765000000.123456, "ended": 1765000000.5, "attempt": 3
    }  # fmt: skip
    assert stored == s.encode(entries)
    assert json.loads(stored) == entries
    assert [step.name for step in s.decode_steps(stored)] == [*before, 'new "step" ü']
