"""Budgets: the marker's ceilings and floors checked against a Measurement.

Like pytest-memray's markers: ``check_budgets`` returns None when every budget holds, and a
small result object with ``as_longrepr()`` (the one-line reason) when one does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..core.catalog import BUDGETS, Budget
from ..core.formats import fmt
from ..measuring.metrics import Measurement


def sample(budget: Budget, m: Measurement) -> str:
    """The sample behind a budget's statistic: pooled tokens (ITL) or runs."""
    if budget.pooled_tokens:
        return f"{m.itl.count} tokens, {m.n_runs} runs"
    return f"{m.n_runs} runs"


@dataclass(frozen=True)
class BudgetBreach:
    key: str
    label: str
    unit: str
    ceiling: bool
    measured: float | None
    budget: float
    sample: str

    def line(self) -> str:
        if self.measured is None:
            return f"{self.label} was not measured by this engine (budget {self.key}={fmt(self.budget)})"
        op = ">" if self.ceiling else "<"
        return (
            f"{self.label} {fmt(self.measured)} {self.unit} {op} budget "
            f"{fmt(self.budget)} {self.unit} ({self.sample})"
        )


@dataclass(frozen=True)
class BudgetFailure:
    """Every budget a measurement broke."""

    label: str
    breaches: tuple[BudgetBreach, ...]

    def as_longrepr(self) -> str:
        prefix = f"[{self.label}] " if self.label else ""
        return prefix + "; ".join(b.line() for b in self.breaches)


def check_budgets(m: Measurement, budgets: Mapping[str, float]) -> BudgetFailure | None:
    breaches = []
    for key, budget in budgets.items():
        b = BUDGETS[key]
        measured = b.read(m)
        ok = measured is not None and (measured <= budget if b.ceiling else measured >= budget)
        if not ok:
            breaches.append(BudgetBreach(key, b.label, b.unit, b.ceiling, measured, budget, sample(b, m)))
    return BudgetFailure(m.label, tuple(breaches)) if breaches else None
