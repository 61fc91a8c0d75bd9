"""Budgets: the marker's ceilings and floors checked against a Measurement.

Like pytest-memray's markers: ``check_budgets`` returns None when every budget holds, and a
small result object with ``as_longrepr()`` (the one-line reason) when one does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ..core.catalog import BUDGETS, is_ceiling, metric_of
from ..core.numbers import fmt
from ..measuring.metrics import Measurement



@dataclass(frozen=True)
class Statistic:
    """A measured quantity a budget can bound."""

    label: str
    unit: str
    ceiling: bool  # True: measured must be <= budget; False: >= budget
    value: Callable[[Measurement], float | None]
    pooled_tokens: bool  # sample is pooled tokens (ITL) rather than runs

    def sample(self, m: Measurement) -> str:
        if self.pooled_tokens:
            return f"{m.itl.count} tokens, {m.n_runs} runs"
        return f"{m.n_runs} runs"


#: Budget key -> the statistic it bounds, from the metric catalog.
STATISTICS: dict[str, Statistic] = {
    b.key: Statistic(b.label, metric_of(b.key).unit, is_ceiling(b.key), b.read, b.pooled_tokens)
    for b in BUDGETS.values()
}


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
        stat = STATISTICS[key]
        measured = stat.value(m)
        ok = measured is not None and (measured <= budget if stat.ceiling else measured >= budget)
        if not ok:
            breaches.append(
                BudgetBreach(key, stat.label, stat.unit, stat.ceiling, measured, budget, stat.sample(m))
            )
    return BudgetFailure(m.label, tuple(breaches)) if breaches else None
