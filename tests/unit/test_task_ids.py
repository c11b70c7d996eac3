"""Generated task ids are unique, also across a fork."""

from __future__ import annotations

import os

from durq.options import new_task_id


def test_ids_are_unique_and_hex() -> None:
    ids = {new_task_id() for _ in range(20_000)}
    assert len(ids) == 20_000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.write(write, "".join(new_task_id() for _ in range(10)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    parent = "".join(new_task_id() for _ in range(10))
    child_ids = {child[i : i + 32] for i in range(0, len(child), 32)}
    parent_ids = {parent[i : i + 32] for i in range(0, len(parent), 32)}
    assert len(child_ids) == 10 and not child_ids & parent_ids
