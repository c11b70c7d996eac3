"""Run schemathesis (its command line, ``--checks all``) against a live server's OpenAPI
document: the same run a person would make, with figures to report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class FuzzRun:
    generated: int
    passed: int
    failures: int
    output: str


def schemathesis_run(
    schema_url: str,
    *,
    headers: dict[str, str],
    max_examples: int,
    workdir: Path,
    config: str = "",
) -> FuzzRun:
    """``schemathesis run SCHEMA --checks all`` with every phase, deterministic data;
    ``config``: a ``schemathesis.toml`` for the run (per-operation settings)."""
    if config:
        (workdir / "schemathesis.toml").write_text(config, encoding="utf-8")
    exe = Path(sys.executable).with_name("schemathesis")
    args = [str(exe), "run", schema_url, "--checks", "all", "-n", str(max_examples)]
    args += ["--generation-deterministic", "--no-color", "--request-timeout", "20"]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"}
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=900, env=env)
    output = done.stdout + done.stderr
    counts = re.search(r"(\d+) generated, (.*)", output)
    assert counts, output[-3000:]
    generated = int(counts.group(1))
    passed = re.search(r"(\d+) passed", counts.group(2))
    failed = re.search(r"(\d+) found", counts.group(2))
    run = FuzzRun(
        generated=generated,
        passed=int(passed.group(1)) if passed else 0,
        failures=0 if failed is None else int(failed.group(1)),
        output=output,
    )
    print(f"schemathesis {schema_url}: {generated} generated, {run.passed} passed")
    assert done.returncode == 0 and run.failures == 0, output[-6000:]
    return run
