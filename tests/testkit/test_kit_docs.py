"""docs/testing.md quotes the example that the suite runs: its code cannot drift from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "examples" / "testing").glob("*.py"))


def test_every_python_block_of_the_testing_guide_is_code_the_suite_runs() -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 8
    code = [source.read_text() for source in SOURCES]
    for block in blocks:
        assert any(block in source for source in code), f"not in examples/testing: {block[:200]}"
