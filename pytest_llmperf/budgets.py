"""Budgets: the marker's ceilings and floors checked against a Measurement.

Like pytest-memray's markers: ``check_budgets`` returns None when every budget holds, and a
small result object with ``as_longrepr()`` (the one-line reason) when one does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from .metrics import Measurement


def fmt(value: float) -> str:
    """Three significant figures for small values, no false precision for large ones."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


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


STATISTICS: dict[str, Statistic] = {
    "p50_ms": Statistic("decode ITL p50", "ms", True, lambda m: m.itl.p50_ms, True),
    "p90_ms": Statistic("decode ITL p90", "ms", True, lambda m: m.itl.p90_ms, True),
    "p95_ms": Statistic("decode ITL p95", "ms", True, lambda m: m.itl.p95_ms, True),
    "p99_ms": Statistic("decode ITL p99", "ms", True, lambda m: m.itl.p99_ms, True),
    "ttft_ms": Statistic("TTFT median", "ms", True, lambda m: m.ttft_ms, False),
    "ttft_p95_ms": Statistic("TTFT p95", "ms", True, lambda m: m.ttft_p95_ms, False),
    "tpot_ms": Statistic("decode TPOT median", "ms", True, lambda m: m.tpot_ms, False),
    "e2e_ms": Statistic("E2E median", "ms", True, lambda m: m.e2e_ms, False),
    "min_tps": Statistic("decode TPS median", "t/s", False, lambda m: m.decode_tps, False),
    "min_prefill_tps": Statistic("prefill TPS median", "t/s", False, lambda m: m.prefill_tps, False),
    "min_mbu": Statistic(
        "decode MBU", "of peak bandwidth", False, lambda m: m.roofline.decode.mbu if m.roofline else None, False
    ),
    "min_goodput": Statistic(
        "goodput", "share", False, lambda m: m.load.goodput if m.load is not None else None, False
    ),
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
