"""Interleaved A/B comparisons with paired statistics and relative budgets (docs/ab.md).

Layers: ``paired`` (statistics, on levels.py's estimator), ``budgets`` (max_slowdown,
min_speedup), ``run`` (interleaving, the result), ``sides`` (what a side may be). No pytest.
"""

from .budgets import BudgetOutcome, RelativeBudget, parse_budgets
from .paired import PairedComparison, paired
from .run import ABResult, Side, block_orders, compare_ab
from .sides import resolve_side

__all__ = [
    "ABResult", "BudgetOutcome", "PairedComparison", "RelativeBudget", "Side",
    "block_orders", "compare_ab", "paired", "parse_budgets", "resolve_side",
]
