"""Integrations of durq with web frameworks (import the one you use; each needs its framework)."""
