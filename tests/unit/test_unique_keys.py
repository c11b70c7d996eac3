"""durq.Unique's keys: the same digest whichever way the picked values are read (from the
payload as given, or from its encoded bytes decoded again), and the digests keys held
before keep; codec's fast paths give what json gives."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from durq import codec
from durq.errors import PayloadError
from durq.uniqueness import Unique


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    """A str subclass: encoded as its text, read back as a plain str."""


# Digests of the key scheme as stored by earlier releases: keys already held must still match.
PINNED = [
    (Unique(keys=["account"]), {"tenant": "t1", "account": 5}, 1000.0,
     "cfed2f9d87cf9a95da0e8a731d1059dcff9e0611faab39977539aba5a3ac931f"),
    (Unique(keys=["account.id", "region"]), {"account": {"id": "ä-7"}, "region": None}, 1000.0,
     "0f18d40697d61bcc126d53701a8007c4b2f7cf91c29a5b068048d7a1387495a4"),
    (Unique(keys=["items.0", "true"]), {"items": [1.5, 2], "true": False}, 1000.0,
     "6a07cf743e20a7d0b8b63aa14b92ff708df23653dee9dee494f5f37fab9057e6"),
    (Unique(keys=["doc"], period=60), {"doc": "x"}, 125.0,
     "08013a15326cb0492327c7e11cf26dcea3c18a32b7eac733f2ed927938625d49"),
    (Unique(), {"b": 1, "a": [True, None]}, 1000.0,
     "1801871fedee6650569f50cfdbe59e6db066b4e5ce6f1a64c4c12b079018dae5"),
    (Unique(period="1h"), {"b": 1, "a": [True, None]}, 7300.0,
     "999547dca0c4536efa75f11faa75675c242d083d532ab9e6703b0c46a1c5dfd6"),
]  # fmt: skip


@pytest.mark.parametrize(("unique", "payload", "now", "digest"), PINNED)
def test_keys_held_before_still_match(
    unique: Unique, payload: dict[str, Any], now: float, digest: str
) -> None:
    raw = codec.encode_payload(payload)
    assert unique.key("q", "t", raw, now)[0] == digest
    assert unique.key("q", "t", raw, now, payload)[0] == digest


def test_a_period_bounds_how_long_the_key_holds() -> None:
    raw = codec.encode_payload({"doc": "x"})
    assert Unique(keys=["doc"], period=60).key("q", "t", raw, 125.0)[1] == 55.0
    assert Unique(keys=["doc"], ttl=10).key("q", "t", raw, 125.0)[1] == 10.0


# Keys that encode to the same JSON name as another (True and "true", 1 and "1"): the
# decoded payload keeps the last of them, which the payload as given cannot tell.
_names = st.sampled_from(["a", "b", "true", "null", "1", "-2", "1.5", True, None, 1, -2, 1.5])
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.builds(Name, st.text(max_size=3))
    | st.just(Colour.RED)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(_names, inner, max_size=4)
    ),
    max_leaves=12,
)
_payloads = st.dictionaries(_names, _values, max_size=5)
_paths = st.lists(
    st.lists(st.sampled_from(["a", "b", "true", "null", "1", "-2", "0"]), min_size=1, max_size=3),
    min_size=1,
    max_size=3,
    unique_by=tuple,
)


@settings(max_examples=400, deadline=None)
@given(payload=_payloads, paths=_paths)
@example(payload={"true": 1, True: 2}, paths=[["true"]])  # JSON keeps the second "true"
@example(payload={"a": {2: "x", 10: "y"}}, paths=[["a"]])  # sorted as numbers, then as text
@example(payload={"a": {1: "x", "1": "y"}}, paths=[["a"]])
@example(payload={"a": (1, Colour.RED, Name("n"))}, paths=[["a"]])
@example(payload={"a": [{"b": 1}]}, paths=[["a", "0", "b"]])
def test_the_payload_as_given_and_its_decoded_bytes_give_one_key(
    payload: dict[Any, Any], paths: list[list[str]]
) -> None:
    unique = Unique(keys=[".".join(p) for p in paths])
    raw = codec.encode_payload(payload)
    assert unique.key("q", "t", raw, 10.0, payload) == unique.key("q", "t", raw, 10.0)


def test_a_payload_too_deep_to_decode_is_refused() -> None:
    raw = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(PayloadError):
        Unique(keys=["a"]).key("q", "t", raw, 0.0)


@pytest.mark.parametrize(
    "text",
    ['{"a":1}', ' {"a":1}', '{"a":1} ', "\n[1, 2]\t", '"x"', "3", "null", "1e5", "[]"],
)
def test_decode_reads_what_json_reads(text: str) -> None:
    assert codec.decode(text) == json.loads(text)
    assert codec.decode(text.encode()) == json.loads(text)
    assert codec.decode(bytearray(text.encode())) == json.loads(text)


@pytest.mark.parametrize("text", ["", " ", '{"a":1}x', '{"a":1} 2', "[1,", "NaN", '{"a":NaN}'])
def test_decode_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        codec.decode(text)


@pytest.mark.parametrize(
    "data",
    [{"b": 1, "a": {"d": [1, 2.5, None], "c": "é"}}, [], "x", 1.0, -0.0, True, None, [{"z": 1}]],
)
def test_canonical_is_sorted_compact_json(data: Any) -> None:
    expected = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert codec.canonical_text(data) == expected
    assert codec.canonical(data) == expected.encode()


def test_canonical_refuses_what_is_not_json() -> None:
    with pytest.raises(ValueError):
        codec.canonical([float("nan")])
    with pytest.raises(TypeError):
        codec.canonical({"when": object()})
