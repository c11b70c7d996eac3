"""A fresh copy of the source tree (what a clone holds: tracked and new files, none that git
ignores), for tests that build the package or follow the README from the start."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The development environment's interpreter and scripts (`make install`).
VENV_BIN = Path(sys.executable).parent


def source_files() -> list[str]:
    """The repository's files as a fresh clone would have them (plus ones not committed yet)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]


def fresh_checkout(dest: Path) -> Path:
    """Copy the source tree into ``dest`` and return it."""
    for name in source_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return dest
