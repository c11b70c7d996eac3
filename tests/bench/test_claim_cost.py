"""``benchmarks/claim_cost.py``: the server's CPU per claim of an empty queue, measured on
the real PostgreSQL server through a build's interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servers import require_server

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))


# The benchmark's database has a fixed name (make bench uses it too) and the figure is the
# server's CPU: never two of these at once.
@pytest.mark.serial
def test_a_run_reports_the_servers_and_the_clients_cpu_per_claim() -> None:
    require_server("postgres")
    from claim_cost import PG_DB, run_once
    from run import recreate_pg_database

    try:
        got = run_once(sys.executable, history=30, claims=50)
    finally:
        recreate_pg_database(drop_only=True, name=PG_DB)
    # A claim costs the server something, and not a whole second.
    assert 0 < got["server_us"] < 1_000_000
    assert 0 < got["client_us"] < 1_000_000
