"""The PostgreSQL broker's notifier: every queue added is sent after its add; a send due
while an enqueue writes waits for that write and carries its queues too."""

from __future__ import annotations

import asyncio

import pytest

from durq.brokers.postgres.wakeup import Notifier


class Sent:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def __call__(self, queues: list[str]) -> None:
        self.calls.append(queues)


async def test_a_lone_add_is_sent_at_once_alone() -> None:
    sent = Sent()
    notifier = Notifier(sent)
    notifier.add(["a"])
    await notifier.flush()
    assert sent.calls == [["a"]]


async def test_a_send_due_during_a_write_waits_for_it_and_carries_both() -> None:
    sent = Sent()
    notifier = Notifier(sent, hold=3600)  # only the write's end may release it
    # As a producer enqueues: one task committed and added, the next one's write begun
    # before the producer yields to the loop.
    notifier.add(["a"])
    with notifier.writing():
        for _ in range(5):
            await asyncio.sleep(0)
        assert sent.calls == []
        notifier.add(["b"])
    await notifier.flush()
    assert sent.calls == [["a", "b"]]


async def test_a_failed_write_releases_the_wait() -> None:
    sent = Sent()
    notifier = Notifier(sent, hold=3600)
    notifier.add(["a"])

    async def write() -> None:
        with notifier.writing():
            await asyncio.sleep(0)
            raise RuntimeError("insert failed")

    with pytest.raises(RuntimeError):
        await asyncio.gather(write(), notifier.flush())
    await notifier.flush()
    assert sent.calls == [["a"]]


async def test_a_write_that_does_not_end_holds_a_send_no_longer_than_the_hold() -> None:
    sent = Sent()
    notifier = Notifier(sent, hold=0.01)
    stuck = asyncio.Event()

    async def write() -> None:
        with notifier.writing():
            await stuck.wait()

    writer = asyncio.create_task(write())
    await asyncio.sleep(0)
    notifier.add(["a"])
    await notifier.flush()  # returns although the write is still open
    assert sent.calls == [["a"]] and not writer.done()
    stuck.set()
    await writer


async def test_writes_begun_after_a_send_fell_due_do_not_hold_it() -> None:
    sent = Sent()
    notifier = Notifier(sent, hold=3600)
    first, second = notifier.writing(), notifier.writing()
    notifier.add(["a"])
    first.__enter__()
    await asyncio.sleep(0)  # the send is due and waits for the first write only
    second.__enter__()
    notifier.add(["q0"])
    first.__exit__(None, None, None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert sent.calls == [["a", "q0"]]  # not held for the second write
    notifier.add(["q1"])
    second.__exit__(None, None, None)
    await notifier.flush()
    assert sent.calls == [["a", "q0"], ["q1"]]
