"""Hostile bytes written straight into storage, on every broker: the task is archived with a
decode error (never unpickled, never evaluated) and the 100 tasks queued behind it all run."""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from pathlib import Path

import pytest

import durq
from durq.states import TaskState
from hostile.storage import write_payload

QUEUE = "hostile"
BEHIND = 100


class _Trap:
    """Unpickling this creates a directory: proof that something ran pickle.loads."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.path,))


def pickle_blob(marker: Path) -> bytes:
    return pickle.dumps({"payload": _Trap(str(marker))}, protocol=pickle.HIGHEST_PROTOCOL)


HOSTILE: dict[str, bytes] = {
    "raw_bytes": bytes(range(256)),
    "invalid_utf8": b'{"name": "\xff\xfe\xc3\x28"}',
    "wrong_envelope_list": b"[1, 2, 3]",
    "wrong_envelope_string": b'"just a string"',
    "wrong_envelope_null": b"null",
    "truncated": b'{"a": [1, 2',
    "deeply_nested": b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "huge_integer": b'{"n": ' + b"9" * 50_000 + b"}",
    "nan": b'{"x": NaN}',
    "infinity": b'{"x": -Infinity}',
    "empty": b"",
    "ten_mib_garbage": b'{"big": "' + b"\x80" * (10 * 1024 * 1024) + b'"}',
}


async def run_hostile(broker_kind: str, broker_url: str, raw: bytes, tmp_path: Path) -> None:
    app = durq.App(broker_url)
    ran: list[str] = []

    @app.task("hostile:victim", queue=QUEUE, max_retry=25)
    async def victim(payload: dict[str, object], ctx: durq.TaskContext) -> None:
        ran.append(ctx.id)

    migrator = app.new_broker()
    await migrator.migrate()
    await migrator.close()
    try:
        await app.enqueue("hostile:victim", {"ok": 1}, queue=QUEUE, task_id="bad")
        await asyncio.to_thread(write_payload, broker_kind, broker_url, QUEUE, "bad", raw)
        for i in range(BEHIND):
            await app.enqueue("hostile:victim", {"i": i}, queue=QUEUE, task_id=f"ok{i}")
        async with app.worker(queues=[QUEUE], concurrency=4, poll_interval=0.1):
            deadline = time.monotonic() + 60
            while True:
                bad = await app.inspector.get_task_info(QUEUE, "bad")
                if bad.state is TaskState.ARCHIVED and len(ran) >= BEHIND:
                    break
                assert time.monotonic() < deadline, (bad.state, bad.last_error, len(ran))
                await asyncio.sleep(0.05)
        assert bad.last_error is not None and "decode" in bad.last_error, bad.last_error
        assert bad.retried <= 1  # archived at once, not retried 25 times
        assert "bad" not in ran
        assert sorted(ran) == sorted(f"ok{i}" for i in range(BEHIND))
        # The inspector can still show the task without failing on its payload.
        assert bad.to_dict()["id"] == "bad"
    finally:
        await app.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_payload_is_archived_and_the_queue_flows(
    broker_kind: str, broker_url: str, case: str, tmp_path: Path
) -> None:
    await run_hostile(broker_kind, broker_url, HOSTILE[case], tmp_path)


@pytest.mark.timeout(90)
async def test_pickle_blob_is_never_unpickled(
    broker_kind: str, broker_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    await run_hostile(broker_kind, broker_url, pickle_blob(marker), tmp_path)
    assert not marker.exists(), "a stored payload was unpickled"


@pytest.mark.timeout(90)
async def test_ten_mib_valid_json_is_refused_and_does_not_stall_the_queue(
    broker_kind: str, broker_url: str, tmp_path: Path
) -> None:
    """A 10 MiB JSON object planted in storage (ten times the enqueue limit): the worker must
    not hang or crash on it, it archives the task (over the payload limit), and the queue behind
    it flows."""
    raw = b'{"big": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    await run_hostile(broker_kind, broker_url, raw, tmp_path)
