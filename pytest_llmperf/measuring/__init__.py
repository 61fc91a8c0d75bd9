"""Traces -> metrics: runs, per-layer timing, roofline, stability, served load."""
