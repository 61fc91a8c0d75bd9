"""Budgets, statistics and baseline verdicts."""
