"""``benchmarks/worker_path.py``: the worker's own path per task on a stand-in broker. Its
workload runs here without callgrind; it must drain every task it hands out, or the count
would be of a worker left waiting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "worker_path.py"


def test_the_workload_drains_every_task() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "workload", "45"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
