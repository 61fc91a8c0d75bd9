"""Baseline records, files and reference figures."""
