"""W21's backlog scenario in full, on every broker kind: tenant A enqueues 100,000 tasks, then
tenants B..K one each. With ``fair=True`` each of B..K starts within one round of claims (11
starts); without it each waits behind A's whole backlog. Prints, per broker, the p99 of the
late tenants' start place (in claims of one task) and of their wait from enqueue to start.
The short form (2,000) runs in ``make test``: tests/conformance/test_fair_backlog.py."""

from __future__ import annotations

import pytest

from conformance.fairkit import late_tenant_starts
from servers import BROKER_KINDS

BACKLOG = 100_000
TENANTS = 10


@pytest.fixture(params=[*BROKER_KINDS, "postgres-pgbouncer", "redis-cluster"])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.chaos
@pytest.mark.timeout(900)
async def test_W21_late_tenants_start_within_one_round_of_100000(
    broker_url: str, broker_kind: str
) -> None:
    starts = await late_tenant_starts(broker_url, backlog=BACKLOG, tenants=TENANTS, fair=True)
    print("\n" + starts.line(broker_kind, fair=True))
    assert len(starts.places) == TENANTS
    assert max(starts.places.values()) <= TENANTS + 1, starts.places


@pytest.mark.chaos
@pytest.mark.timeout(1800)
async def test_W21_without_fair_late_tenants_wait_behind_100000(
    broker_url: str, broker_kind: str
) -> None:
    starts = await late_tenant_starts(
        broker_url, backlog=BACKLOG, tenants=TENANTS, fair=False, per_claim=1000
    )
    print("\n" + starts.line(broker_kind, fair=False))
    assert len(starts.places) == TENANTS
    assert min(starts.places.values()) > BACKLOG, starts.places
