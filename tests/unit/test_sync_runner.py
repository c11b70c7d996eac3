"""The sync face (E10) from a threaded WSGI server: concurrent first calls share one loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import durq
import durq.app
from durq.sync import SyncRunner


def test_concurrent_first_sync_calls_start_one_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[SyncRunner] = []

    class SlowRunner(SyncRunner):
        def __init__(self) -> None:
            time.sleep(0.05)  # widen the window between the check and the assignment
            super().__init__()
            made.append(self)

    monkeypatch.setattr(durq.app, "SyncRunner", SlowRunner)
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    start = threading.Barrier(8)

    def first_call() -> None:
        start.wait()
        app._runner()

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(made) == 1, "each extra runner leaks a loop thread and its broker"
    finally:
        for runner in made:
            runner.close()
