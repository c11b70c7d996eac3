"""W21's backlog scenario on every broker, short form (``make chaos`` runs it with a backlog
of 100,000: tests/chaos/test_fair_backlog.py): tenant A enqueues 2,000 tasks, then tenants
B..K one each. With ``fair=True`` each of B..K starts within one round of claims (11 starts:
one of each tenant); without it each waits behind A's whole backlog."""

from __future__ import annotations

import pytest
from fairkit import late_tenant_starts

BACKLOG = 2000
TENANTS = 10


@pytest.mark.timeout(300)
async def test_W21_late_tenants_start_within_one_round(broker_url: str, broker_kind: str) -> None:
    starts = await late_tenant_starts(broker_url, backlog=BACKLOG, tenants=TENANTS, fair=True)
    print("\n" + starts.line(broker_kind, fair=True))
    assert len(starts.places) == TENANTS
    # One round: A's first task and one of each late tenant.
    assert max(starts.places.values()) <= TENANTS + 1, starts.places


@pytest.mark.timeout(300)
async def test_W21_without_fair_late_tenants_wait_behind_the_backlog(
    broker_url: str, broker_kind: str
) -> None:
    starts = await late_tenant_starts(
        broker_url, backlog=BACKLOG, tenants=TENANTS, fair=False, per_claim=250
    )
    print("\n" + starts.line(broker_kind, fair=False))
    assert len(starts.places) == TENANTS
    assert min(starts.places.values()) > BACKLOG, starts.places
