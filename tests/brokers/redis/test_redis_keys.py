"""Key names: one module builds them; queue names and task ids cannot leave their namespace
(S3), and every key of one queue lands in one cluster slot."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durq.brokers.redis.keys import Keys, QueueKeys, check_prefix
from durq.brokers.redis.lua import SCRIPT_NAMES, load_scripts
from durq.errors import ConfigurationError, InvalidNameError

queue_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,40}", fullmatch=True)
task_ids = st.from_regex(r"[A-Za-z0-9_.:\-@+=/]{1,60}", fullmatch=True)
_QUEUE_KEY_ATTRS = [
    "pending",
    "scheduled",
    "retry",
    "active",
    "completed",
    "archived",
    "paused",
    "seq",
    "unique",
    "stats",
    "limits",
    "held",
    "limit_waiting",
]


def hash_tag(key: str) -> str:
    """The part of a key Redis Cluster hashes (the first non-empty {...})."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if start == -1 or end == -1 or end == start + 1:
        return key
    return key[start + 1 : end]


def queue_keys(k: QueueKeys, task_id: str) -> list[str]:
    return [getattr(k, a) for a in _QUEUE_KEY_ATTRS] + [
        k.task(task_id),
        k.stats_day(date(2030, 1, 1)),
    ]


@given(queue=queue_names, task_id=task_ids)
def test_every_key_of_a_queue_is_under_the_prefix_and_in_its_slot(queue: str, task_id: str) -> None:
    k = Keys("durq").queue(queue)
    for key in queue_keys(k, task_id):
        assert key.startswith("durq:{")
        assert hash_tag(key) == queue


@given(a=st.tuples(queue_names, task_ids), b=st.tuples(queue_names, task_ids))
def test_distinct_names_never_share_a_task_key(a: tuple[str, str], b: tuple[str, str]) -> None:
    keys = Keys("p")
    ka, kb = keys.queue(a[0]).task(a[1]), keys.queue(b[0]).task(b[1])
    assert (ka == kb) == (a == b)


@given(queue=queue_names, task_id=task_ids)
def test_a_task_key_never_equals_a_queue_structure_key(queue: str, task_id: str) -> None:
    keys = Keys("p")
    k = keys.queue(queue)
    task = k.task(task_id)
    structures = {getattr(keys.queue(q), a) for q in (queue, "default") for a in _QUEUE_KEY_ATTRS}
    assert task not in structures
    assert task not in {keys.queues, keys.paused, keys.workers, keys.schema}


@pytest.mark.parametrize(
    "bad", ["", "a{b}", "x}", "{x", "a b", "a*", "q?", "a[1]", "bad\n", "é", "x" * 101]
)
def test_bad_queue_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidNameError):
        Keys("durq").queue(bad)


@pytest.mark.parametrize("bad", ["", "a{b}", "}", "a b", "*", "x\x00", "a\\b", "i" * 201])
def test_bad_task_ids_are_refused(bad: str) -> None:
    with pytest.raises(InvalidNameError):
        Keys("durq").queue("default").task(bad)


@pytest.mark.parametrize("bad", ["", "a:b", "a*", "{x}", "a b", "p" * 65])
def test_bad_prefixes_are_refused(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        check_prefix(bad)


def test_worker_ids_are_escaped() -> None:
    key = Keys("durq").worker("host {x}*:1")
    assert key == "durq:worker:host%20%7Bx%7D%2A:1"


_SCRIPTS = Path(__file__).parents[3] / "src" / "durq" / "brokers" / "redis" / "scripts"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_documents_keys_argv_and_return_and_never_scans(name: str) -> None:
    text = (_SCRIPTS / f"{name}.lua").read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("--"))
    assert text.startswith(f"-- {name}:")
    assert "KEYS[1]" in header and "ARGV[1]" in header and "Returns" in header
    calls = re.findall(r"redis\.call\('([A-Z]+)'", load_scripts()[name].source.decode())
    assert calls and not {"KEYS", "SCAN", "FLUSHDB", "FLUSHALL"} & set(calls)
    # Scripts may read the server's clock (Redis replicates a script's effects), in one place
    # only: clock() of _lib.lua (a test's injected clock replaces it there).
    assert "'TIME'" not in text
    assert (_SCRIPTS / "_lib.lua").read_text().count("redis.call('TIME')") == 1


def test_no_key_name_is_built_outside_keys_py() -> None:
    src = _SCRIPTS.parent
    for path in src.glob("*.py"):
        if path.name == "keys.py":
            continue
        text = path.read_text()
        # A hash tag in an f-string, or something glued onto the prefix, means a key name.
        assert "{{" not in text and "prefix}:" not in text, path.name
