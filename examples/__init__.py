"""Runnable examples of durq."""
