"""The brokers build TaskInfo with ``make_info``: the same object as the constructor's."""

from __future__ import annotations

import dataclasses

import pytest

from durq.states import TaskState
from durq.task import TaskInfo, make_info

REQUIRED = {
    "id": "a",
    "queue": "q",
    "type": "t",
    "raw_payload": b"{}",
    "state": TaskState.PENDING,
    "max_retry": 3,
}


def test_make_info_equals_the_constructor() -> None:
    full = {f.name: getattr(TaskInfo(**REQUIRED), f.name) for f in dataclasses.fields(TaskInfo)}
    full |= {"retried": 2, "headers": {"k": "v"}, "last_error": "boom"}
    built = make_info(**full)
    assert built == TaskInfo(**full)
    assert built.payload == {}
    assert dataclasses.replace(built, retried=1).retried == 1


def test_defaults_are_filled_and_headers_are_not_shared() -> None:
    one, two = make_info(**REQUIRED), make_info(**REQUIRED)
    assert one == TaskInfo(**REQUIRED)
    assert one.headers == {} and one.headers is not two.headers


@pytest.mark.parametrize(
    "values",
    [
        {k: v for k, v in REQUIRED.items() if k != "state"},
        REQUIRED | {"no_such_field": 1},
    ],
    ids=["missing", "unknown"],
)
def test_a_missing_or_unknown_field_is_a_type_error(values: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        make_info(**values)
