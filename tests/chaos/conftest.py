"""Fixtures of the chaos scenarios: a cluster of real worker processes and private servers.

Each scenario has a short form (runs in ``make test``) and a full form marked ``chaos``
(``make chaos``). Figures are printed and, with ``DURQ_CHAOS_REPORT=path``, appended to that
file as JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from chaos.harness import Cluster, Report, ThrowawayPostgres
from servers import PrivateRedis

T = TypeVar("T")


def made_and_closed(
    make: Callable[..., T], close: Callable[[T], None]
) -> Iterator[Callable[..., T]]:
    """A fixture body: hand the test ``make``, then ``close`` everything it made, in order."""
    made: list[T] = []

    def tracked(*args: Any, **kwargs: Any) -> T:
        item = make(*args, **kwargs)
        made.append(item)
        return item

    yield tracked
    for item in made:
        close(item)


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    def make(url: str, size: int, *args: str, name: str = "ledger") -> Cluster:
        if url.startswith("memory:"):
            # Each worker process would have a memory broker of its own, empty.
            pytest.skip("worker processes cannot share a memory:// broker")
        return Cluster(url, tmp_path / name, size, *args)

    yield from made_and_closed(make, Cluster.stop)


@pytest.fixture
def throwaway_pg(tmp_path: Path) -> Iterator[Callable[[], ThrowawayPostgres]]:
    def make() -> ThrowawayPostgres:
        try:
            return ThrowawayPostgres()
        except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"cannot create a private PostgreSQL cluster: {exc}")

    yield from made_and_closed(make, ThrowawayPostgres.close)


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[Callable[..., PrivateRedis]]:
    def make(*config: str, name: str = "r") -> PrivateRedis:
        try:
            return PrivateRedis(tmp_path / name, *config)
        except RuntimeError as exc:
            pytest.skip(str(exc))

    yield from made_and_closed(make, PrivateRedis.close)


_kill_lines: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The re-run window of every scenario that killed workers, on each broker."""
    if _kill_lines:
        terminalreporter.section("tasks run again per SIGKILL")
        for line in _kill_lines:
            terminalreporter.write_line(line)


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[[Report], None]:
    """Print a scenario's figures and append them to ``$DURQ_CHAOS_REPORT``."""

    def emit(report: Report) -> None:
        line = f"\n[{request.node.name}] {report.summary()}"
        print(line)
        if report.kills:
            _kill_lines.append(
                f"{request.node.name}: {report.kills} kills, re-runs per kill max "
                f"{report.max_reruns_per_kill}, completed twice per kill max "
                f"{report.max_duplicates_per_kill} mean {report.duplicates_per_kill:.2f}"
            )
        target = os.environ.get("DURQ_CHAOS_REPORT")
        if target:
            row = {
                "scenario": request.node.name,
                "tasks": report.tasks,
                "runs": report.runs,
                "kills": report.kills,
                "restarts": report.restarts,
                "lost": len(report.lost),
                "unexpected": len(report.unexpected),
                "duplicated": report.duplicated,
                "completed_twice": report.completed_twice,
                "max_reruns_per_kill": report.max_reruns_per_kill,
                "max_duplicates_per_kill": report.max_duplicates_per_kill,
                "duplicates_per_kill": round(report.duplicates_per_kill, 2),
                "unexplained": len(report.unexplained_duplicates),
                "overlaps": len(report.overlaps),
                "final": report.final_states,
                "recovery_p50": round(sorted(report.recovery)[len(report.recovery) // 2], 3)
                if report.recovery
                else None,
                "recovery_p99": round(report.recovery_p99, 3),
                **{k: v for k, v in report.extra.items() if isinstance(v, int | float | str)},
            }
            with open(target, "a") as fh:
                fh.write(json.dumps(row) + "\n")

    return emit
