"""Demos that show durq at work (``durq demo``)."""
