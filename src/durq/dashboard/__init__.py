"""The web dashboard and admin HTTP API (needs ``durq[web]``): :func:`create_dashboard`."""

from durq.dashboard.app import DashboardSettings, create_dashboard
from durq.dashboard.security import generate_token

__all__ = ["DashboardSettings", "create_dashboard", "generate_token"]
