"""docs/integrations.md's claims about the Django backend, read from the page and checked
against the code: a changed default or limit fails here until the page says it."""

from __future__ import annotations

import re
from pathlib import Path

from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY

from durq import durations
from durq.contrib.django import DurqBackend
from durq.contrib.django.backend import DEFAULT_RETENTION
from durq.options import DEFAULT_RETENTION as DURQ_RETENTION
from durq.options import MAX_PRIORITY, MIN_PRIORITY
from durq.worker.executor import MAX_ERROR, MAX_TRACEBACK

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = (DOCS / "integrations.md").read_text(encoding="utf-8")
DJANGO = PAGE[PAGE.index("## Django") : PAGE.index("## FastAPI")]
WORDS = {"an hour": 3600.0, "a day": 86400.0, "a week": 7 * 86400.0}


def option_row(name: str) -> str:
    (row,) = [line for line in DJANGO.splitlines() if line.startswith(f"| `{name}` |")]
    return row


def test_retention_defaults_are_the_code_s() -> None:
    row = option_row("retention")
    default = re.match(r'\| `retention` \| `"(\w+)"`', row)
    assert default is not None and durations.seconds(default.group(1)) == DEFAULT_RETENTION
    durq_default = re.search(r"durq's own default keeps a completed task (an hour|a day)", row)
    assert durq_default is not None and WORDS[durq_default.group(1)] == DURQ_RETENTION
    assert "at once" not in row


def test_priority_is_described_as_supported_with_its_range() -> None:
    assert DurqBackend.supports_priority is True
    assert "`supports_priority = True`" in DJANGO and "supports_priority = False" not in DJANGO
    assert "priority` other than 0 is refused" not in DJANGO
    bounds = re.search(r"the same range as\s+Django's, (-?\d+) to (-?\d+)", DJANGO)
    assert bounds is not None
    low, high = int(bounds.group(1)), int(bounds.group(2))
    assert (low, high) == (MIN_PRIORITY, MAX_PRIORITY) == (TASK_MIN_PRIORITY, TASK_MAX_PRIORITY)


def test_error_and_traceback_limits_are_the_executor_s() -> None:
    error = re.search(r"type and message, at most (\d+) KiB", DJANGO)
    traceback = re.search(r"kept beside it \(at most\s+(\d+) KiB", DJANGO)
    assert error is not None and int(error.group(1)) * 1024 == MAX_ERROR
    assert traceback is not None and int(traceback.group(1)) * 1024 == MAX_TRACEBACK
    results = (DOCS / "results.md").read_text(encoding="utf-8")
    stored = re.search(r"at most (\d+) KiB: when longer, its start and its end", results)
    assert stored is not None and int(stored.group(1)) * 1024 == MAX_TRACEBACK
