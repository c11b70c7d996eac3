"""W22's backlog scenario on every broker, short form (``make chaos`` runs it with a backlog
of 100,000: tests/chaos/test_fair_backlog.py): tenant A enqueues 2,000 tasks, then tenants
B..K one each. With ``fair=True`` each of B..K starts within one round of claims (11 starts:
one of each tenant); without it each waits behind A's whole backlog."""

from __future__ import annotations

import pytest
from fairkit import check_late_tenants


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fair", [True, False], ids=["fair", "plain"])
async def test_W22_late_tenants_start_within_one_round_only_when_fair(
    broker_url: str, broker_kind: str, fair: bool
) -> None:
    await check_late_tenants(broker_url, broker_kind, backlog=2000, fair=fair)
