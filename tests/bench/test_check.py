"""``make bench-check`` (``benchmarks/check.py``): the recorded baseline against figures with a
rise planted in them. The figures are the baseline's own, counted under callgrind when it was
recorded; counting them again takes minutes, so that is ``make bench-check``'s, not the suite's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from check import BASELINE, TOLERANCE, compare  # noqa: E402


def recorded() -> dict[str, float]:
    figures: dict[str, float] = json.loads(BASELINE.read_text())["figures"]
    return figures


def test_the_baseline_notes_what_its_counts_depend_on() -> None:
    saved = json.loads(BASELINE.read_text())
    assert {"python", "platform", "cpu", "commit", "libraries"} <= saved["machine"].keys()
    figures = saved["figures"]
    for broker in ("memory", "sqlite"):
        for figure in ("enqueue", "claim", "task"):
            assert figures[f"{broker} {figure}"] > 0


def test_a_rise_over_the_tolerance_fails_one_line_per_figure() -> None:
    baseline = recorded()
    assert compare(baseline, baseline) == []
    within = {name: value * (1 + TOLERANCE * 0.8) for name, value in baseline.items()}
    assert compare(baseline, within) == []
    planted = dict(baseline)
    planted["sqlite task"] = baseline["sqlite task"] * 1.06
    planted["memory enqueue"] = baseline["memory enqueue"] * 1.5
    planted["memory claim"] = baseline["memory claim"] * 0.5  # cheaper passes
    failures = compare(baseline, planted)
    assert len(failures) == 2
    assert failures[0].startswith("memory enqueue:") and "+50.0%" in failures[0]
    assert failures[1].startswith("sqlite task:") and "+6.0%" in failures[1]
    del planted["sqlite claim"]
    assert any(line.startswith("sqlite claim: not measured") for line in compare(baseline, planted))


def test_the_command_exits_1_on_a_planted_rise(tmp_path: Path) -> None:
    def check(figures: dict[str, float]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "current.json"
        path.write_text(json.dumps({"figures": figures}))
        command = [sys.executable, str(BENCHMARKS / "check.py"), "--current", str(path)]
        return subprocess.run(command, capture_output=True, text=True)

    baseline = recorded()
    passed = check(baseline)
    assert passed.returncode == 0, passed.stderr
    assert "no figure rose more than 5%" in passed.stdout
    planted = {**baseline, "memory task": baseline["memory task"] * 1.07}
    failed = check(planted)
    assert failed.returncode == 1
    assert failed.stderr.splitlines() == [
        f"memory task: {planted['memory task']:,.0f} instructions, +7.0% over the baseline"
        f" {baseline['memory task']:,.0f} (tolerance 5%)"
    ]


def test_a_baseline_counted_the_earlier_way_is_refused(tmp_path: Path) -> None:
    """Whole runs and sections count different things: comparing them would fail or pass
    for nothing, so the check asks for the baseline to be recorded again."""
    old = {"brokers": "memory", "sizes": [100, 300], "figures": recorded()}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "now.json").write_text(json.dumps({"figures": recorded()}))
    command = [
        sys.executable,
        str(BENCHMARKS / "check.py"),
        "--baseline",
        str(tmp_path / "old.json"),
    ]
    done = subprocess.run(
        [*command, "--current", str(tmp_path / "now.json")], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "counted another way" in done.stderr and "record it again" in done.stderr


def test_a_section_s_count_is_the_least_of_its_rounds(tmp_path: Path) -> None:
    """callgrind writes a dump per section; a round that background work fell in counts more."""
    from callgrind import section_counts

    for i, (name, total) in enumerate(
        [("claim", 900), ("claim", 700), ("task", 50), ("claim", 800)]
    ):
        (tmp_path / f"out.{i + 1}").write_text(
            f"version: 1\ndesc: Trigger: Client Request: {name}\nsummary: {total}\n"
        )
    (tmp_path / "out").write_text("desc: Trigger: Program termination\nsummary: 5\n")
    assert section_counts(str(tmp_path / "out")) == {"claim": 700, "task": 50}
