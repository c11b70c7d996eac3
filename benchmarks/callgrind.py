"""Counting instructions of one section of a process: valgrind's callgrind with
``--instr-atstart=no`` and the marks of ``callgrind_marks.c`` (built here with gcc), which
start counting, and stop and dump the count under the section's name."""

from __future__ import annotations

import contextlib
import ctypes
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "callgrind_marks.c"


@contextlib.contextmanager
def marks_library() -> Iterator[str]:
    """The marks built as a shared library, for the measured process to load (its path)."""
    with tempfile.TemporaryDirectory(prefix="durq-marks-") as build:
        lib = f"{build}/marks.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", lib, str(SOURCE)], check=True)
        yield lib


class Marks:
    """In the measured process: ``start()`` and ``stop(name)`` around a section (nothing
    when not run under callgrind with the library)."""

    def __init__(self, lib: str | None) -> None:
        self.lib = ctypes.CDLL(lib) if lib else None

    def start(self) -> None:
        if self.lib is not None:
            self.lib.durq_cg_start()

    def stop(self, name: str) -> None:
        if self.lib is not None:
            self.lib.durq_cg_stop(name.encode())


def section_counts(prefix: str) -> dict[str, int]:
    """Section name -> instructions, from the dumps ``prefix.1``, ``.2``...: the least of a
    section's rounds (background work that follows the clock, not the calls, falls in some
    rounds more than others; the least is closest to the section's own)."""
    found: dict[str, int] = {}
    for path in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        text = path.read_text(errors="replace")
        name = re.search(r"^desc: Trigger: (?:Client Request: |dump )(.+)$", text, re.M)
        total = re.search(r"^summary: (\d+)", text, re.M)
        if name and total:
            key = name.group(1).strip()
            found[key] = min(found.get(key, 1 << 62), int(total.group(1)))
    return found
