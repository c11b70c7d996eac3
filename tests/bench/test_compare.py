"""``benchmarks/compare.py``'s arithmetic: the paired spread of each ratio and the table of a
saved run (the runs themselves are ``make bench``'s, not the suite's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from compare import paired_spread  # noqa: E402


def runs(values: list[float]) -> list[dict[str, float]]:
    return [{"enqueue_per_s": v} for v in values]


def test_spread_is_the_middle_half_of_the_ratios_round_by_round() -> None:
    base = runs([100, 200, 100, 100, 100])
    other = runs([90, 200, 110, 120, 100])  # ratios 0.9, 1.0, 1.1, 1.2, 1.0
    assert paired_spread(base, other, "enqueue_per_s") == (1.0, 1.1)


def test_spread_of_few_rounds_is_their_range_and_skips_missing_figures() -> None:
    base = runs([100, 100, 100])
    other = [{"enqueue_per_s": 80.0}, {"enqueue_per_s": None}, {"enqueue_per_s": 130.0}]
    assert paired_spread(base, other, "enqueue_per_s") == (0.8, 1.3)
    assert paired_spread(base, runs([]), "enqueue_per_s") is None


def test_report_prints_the_table_of_a_saved_run(tmp_path: Path) -> None:
    saved = {
        "redis/before": [
            {"p50": 2.0, "enqueue_per_s": 1000.0},
            {"p50": 2.0, "enqueue_per_s": 900.0},
        ],
        "redis/main": [{"p50": 1.0, "enqueue_per_s": 1100.0}, {"p50": 3.0, "enqueue_per_s": 900.0}],
    }
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(saved))
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "compare.py"), "--report", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| redis | enqueue one-by-one /s | 950.0 | 1,000.0 | 1.05 | 1.00 to 1.10 |" in out
    assert "| redis | pickup p50 ms | 2.0 | 2.0 | 1.00 | 0.50 to 1.50 |" in out


def test_a_build_given_twice_needs_two_labels() -> None:
    """The same interpreter under two labels is the run's control; under one label its runs
    would land in one column, mixed up with the other build's."""
    python = sys.executable
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "compare.py"),
            "--build",
            f"before={python}",
            "--build",
            f"main={python}",
            "--build",
            f"before={python}",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "give each --build its own LABEL" in out.stderr
