"""Logs, metrics, traces and health probes."""
