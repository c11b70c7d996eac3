"""libfaketime for the clock tests: Debian's ``faketime`` package (installed by ``.ci/run``).

Absent, the tests skip with the reason; under ``CI=true`` they fail instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from servers import IN_CI

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.fixture
def faketime() -> Path:
    """The preload library; skips (fails under CI) when the package is missing."""
    found = next(
        (p for p in (LIBFAKETIME, *Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))),
        None,
    )
    if found is None or not found.exists():
        message = "libfaketime is not installed (Debian package faketime)"
        if IN_CI:
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)
    return found
