"""W22's backlog scenario in full, on every broker kind: tenant A enqueues 100,000 tasks, then
tenants B..K one each. With ``fair=True`` each of B..K starts within one round of claims (11
starts); without it each waits behind A's whole backlog. Prints, per broker, the p99 of the
late tenants' start place (in claims of one task) and of their wait from enqueue to start.
The short form (2,000) runs in ``make test``: tests/conformance/test_fair_backlog.py."""

from __future__ import annotations

import pytest

from conformance.fairkit import check_late_tenants
from servers import BROKER_KINDS


@pytest.fixture(params=[*BROKER_KINDS, "postgres-pgbouncer", "redis-cluster"])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.chaos
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fair", [True, False], ids=["fair", "plain"])
async def test_W22_late_tenants_start_within_one_round_of_100000_only_when_fair(
    broker_url: str, broker_kind: str, fair: bool
) -> None:
    await check_late_tenants(broker_url, broker_kind, backlog=100_000, fair=fair)
