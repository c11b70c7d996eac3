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

import pytest

from chaos.harness import Cluster, Report, ThrowawayPostgres, ThrowawayRedis


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(url: str, size: int, *args: str, name: str = "ledger") -> Cluster:
        cluster = Cluster(url, tmp_path / name, size, *args)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


@pytest.fixture
def throwaway_pg(tmp_path: Path) -> Iterator[Callable[[], ThrowawayPostgres]]:
    servers: list[ThrowawayPostgres] = []

    def make() -> ThrowawayPostgres:
        try:
            server = ThrowawayPostgres()
        except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"cannot create a private PostgreSQL cluster: {exc}")
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[Callable[..., ThrowawayRedis]]:
    servers: list[ThrowawayRedis] = []

    def make(*config: str, name: str = "r") -> ThrowawayRedis:
        try:
            server = ThrowawayRedis(tmp_path / name, *config)
        except RuntimeError as exc:
            pytest.skip(str(exc))
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[[Report], None]:
    """Print a scenario's figures and append them to ``$DURQ_CHAOS_REPORT``."""

    def emit(report: Report) -> None:
        line = f"\n[{request.node.name}] {report.summary()}"
        print(line)
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
