"""``durq worker --reload``, for development only: run the worker as a child process and
start it again when a ``.py`` file under the current directory changes.

A polling loop over file modification times (twice a second; hidden directories,
``__pycache__``, virtual environments and ``node_modules`` skipped), so it needs nothing
installed. A change stops the worker as SIGTERM does (running tasks get the shutdown timeout,
then go back to their queue) and starts a new one. A worker that exits by itself (say, an
import error) is started again at the next change. SIGTERM or Ctrl-C stops the worker and
the reloader."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from durq.worker.supervisor import SUPERVISOR_ENV

log = logging.getLogger("durq.reload")

#: Directories never watched (besides hidden ones).
SKIP = frozenset({"__pycache__", "node_modules", "venv", "env", "site-packages"})


def snapshot(root: Path) -> dict[str, int]:
    """Modification time of every ``.py`` file under ``root``."""
    found: dict[str, int] = {}
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in SKIP]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                try:
                    found[path] = os.stat(path).st_mtime_ns
                except OSError:  # removed meanwhile: the next snapshot says so
                    continue
    return found


def changes(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The files added, removed or modified between two snapshots."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def run_reloading(command: Sequence[str], root: Path, interval: float = 0.5) -> int:
    """Run ``command`` (a ``durq worker`` without ``--reload``) until SIGTERM/SIGINT,
    starting it again after each change under ``root``; the exit code for the command."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}  # it stops if this process dies
    log.info("reload: watching *.py under %s (development only)", root)
    while not stop.is_set():
        # Its own session: Ctrl-C reaches only this process, which passes it on once.
        argv = list(command)  # durq's own command line, not input
        child = subprocess.Popen(argv, env=env, start_new_session=True)  # noqa: S603
        seen = snapshot(root)
        changed: list[str] = []
        while child.poll() is None and not stop.is_set() and not changed:
            stop.wait(interval)
            changed = changes(seen, snapshot(root))
        if child.poll() is None:
            if changed:
                log.info("reload: %s changed; restarting the worker", ", ".join(changed[:3]))
            child.send_signal(signal.SIGTERM)
            child.wait()
            continue
        log.warning("reload: the worker exited (%d); waiting for a change", child.returncode)
        while not stop.is_set() and not changes(seen, snapshot(root)):
            stop.wait(interval)
    return 0
