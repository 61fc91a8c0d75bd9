"""Budgets: absolute ones on a Measurement (the marker's min_tps, p95_ms...) and relative ones on
an interleaved A/B's paired comparison (max_slowdown, min_speedup).

Budgets: the marker's ceilings and floors checked against a Measurement.

Like pytest-memray's markers: ``check_budgets`` returns None when every budget holds, and a
small result object with ``as_longrepr()`` (the one-line reason) when one does not.

Relative budgets: B against A, measured side by side ("Q8_0 decode at least 1.2x F16's",
"flash attention must not slow prefill by more than 3%").

``max_slowdown=0.03`` (or ``"3%"``) bounds B's time / A's time by 1.03; ``min_speedup=1.5``
asks B's rate to be at least 1.5x A's (B's time / A's <= 1 / 1.5). A number applies to both
phases (prefill: TTFT, decode: TPOT); a mapping names phases or metrics
(``{"decode": 0.05, "e2e_ms": 0.1}``). The verdict follows the paired CI, as a baseline
REGRESSION follows its CI: breached when the whole 95% CI lies beyond the limit (fails the
test), met when the whole CI lies within it, undecided otherwise (shown, does not fail).

Output-agreement budgets (``min_top1_agreement``, ``max_kl``, ``max_kl_p99``; the catalog's
``AGREEMENT_BUDGETS``): B's outputs against A's (``measuring.agreement``), judged exactly;
an A/B whose sides expose no token probabilities fails them with a line saying so. Under
``--llmperf-against`` they bound each measurement's outputs against REF's (REF is A, this tree
B; ``against_agreement``), as its other budgets are checked on this tree's side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.catalog import AGREEMENT_BUDGETS, BUDGETS, AgreementBudget, Budget, direct_sample
from ..core.errors import ConfigError
from ..core.formats import fmt
from ..measuring.agreement import Agreement
from ..measuring.metrics import Measurement
from .paired import PAIRED_METRICS, PHASE_METRIC, PairedComparison


def sample(budget: Budget, m: Measurement) -> str:
    """The sample behind a budget's statistic: pooled tokens (ITL) or runs."""
    if budget.pooled_tokens:
        return f"{m.itl.count} tokens, {m.n_runs} runs"
    return direct_sample(budget.metric, m) or f"{m.n_runs} runs"


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
            f"{self.label} {fmt(self.measured)} {self.unit} {op} budget {fmt(self.budget)} {self.unit} ({self.sample})"
        )


@dataclass(frozen=True)
class BudgetFailure:
    """Every budget a measurement broke."""

    label: str
    breaches: tuple[BudgetBreach | AgreementBreach, ...]

    def as_longrepr(self) -> str:
        prefix = f"[{self.label}] " if self.label else ""
        return prefix + "; ".join(b.line() for b in self.breaches)


@dataclass(frozen=True)
class AgreementBreach:
    """An output-agreement budget of a measurement against ``--llmperf-against``'s REF that did
    not hold (or could not be checked: no agreement), as ``AgreementOutcome.line`` says it."""

    key: str
    text: str

    def line(self) -> str:
        return self.text


def against_agreement(m: Measurement, given: Mapping[str, Any]) -> tuple[tuple[AgreementBreach, ...], int]:
    """(the breaches, how many budgets) of the marker's agreement budgets (``given``: its A/B
    keys) on a measurement judged against REF (``m.agreement``; None: it was not compared)."""
    budgets = parse_agreement_budgets(**{k: given.get(k) for k in AGREEMENT_BUDGETS})
    agreement = m.agreement or Agreement(reason="not compared with REF")
    outcomes = [judge_agreement(budget, limit, agreement) for budget, limit in budgets]
    breaches = tuple(AgreementBreach(o.budget.key, o.line("REF", "this tree")) for o in outcomes if o.status != "met")
    return breaches, len(budgets)


def check_budgets(
    m: Measurement, budgets: Mapping[str, float], also: tuple[AgreementBreach, ...] = ()
) -> BudgetFailure | None:
    """The budgets ``m`` broke (``also``: agreement budgets against REF, judged already)."""
    breaches: list[BudgetBreach | AgreementBreach] = []
    for key, budget in budgets.items():
        b = BUDGETS[key]
        measured = b.read(m)
        if not b.holds(measured, budget):
            breaches.append(BudgetBreach(key, b.label, b.unit, b.ceiling, measured, budget, sample(b, m)))
    breaches += also
    return BudgetFailure(m.label, tuple(breaches)) if breaches else None


@dataclass(frozen=True)
class RelativeBudget:
    kind: str  # "max_slowdown" | "min_speedup"
    target: str  # the phase or metric the user named
    metric: str
    value: float  # 0.05 (a share) for max_slowdown, 1.5 (a factor) for min_speedup

    @property
    def max_ratio(self) -> float:
        """The largest B/A time ratio the budget allows."""
        return 1.0 + self.value if self.kind == "max_slowdown" else 1.0 / self.value

    def describe(self) -> str:
        if self.kind == "max_slowdown":
            return (
                f"max_slowdown {self.value:.0%}"
                if self.value * 100 == round(self.value * 100)
                else f"max_slowdown {self.value:.1%}"
            )
        return f"min_speedup {self.value:g}x"


@dataclass(frozen=True)
class BudgetOutcome:
    budget: RelativeBudget
    comparison: PairedComparison
    status: str  # "met" | "breached" | "undecided"

    def line(self, a_name: str, b_name: str) -> str:
        """One line naming both sides and the ratio with its CI."""
        c, b = self.comparison, self.budget
        if b.kind == "max_slowdown":
            shown = (
                f"{c.label} B/A {c.ratio:.3f} (95% CI {c.ci_low:.3f}..{c.ci_high:.3f}, {c.n_pairs} pairs) "
                f"vs limit {b.max_ratio:.3f}"
            )
        else:
            shown = (
                f"speedup of B over A {c.speedup:.3f}x (95% CI {1 / c.ci_high:.3f}..{1 / c.ci_low:.3f}, "
                f"{c.n_pairs} pairs, from {c.label}) vs at least {b.value:g}x"
            )
        word = {"breached": "breaks", "met": "meets", "undecided": "cannot show it meets"}[self.status]
        return f"{b.target}: B [{b_name}] vs A [{a_name}]: {shown}: {word} {b.describe()}"


def parse_budgets(max_slowdown: Any = None, min_speedup: Any = None) -> tuple[RelativeBudget, ...]:
    """The budgets as given to ``compare()`` or the marker; a ConfigError names what is wrong."""
    out: list[RelativeBudget] = []
    for kind, given in (("max_slowdown", max_slowdown), ("min_speedup", min_speedup)):
        if given is None:
            continue
        items = given.items() if isinstance(given, Mapping) else [(p, given) for p in PHASE_METRIC]
        for target, value in items:
            metric = PHASE_METRIC.get(target, target)
            if metric not in PAIRED_METRICS:
                raise ConfigError(
                    f"{kind}: unknown phase or metric {target!r}; use prefill, decode or one of {', '.join(PAIRED_METRICS)}"
                )
            out.append(RelativeBudget(kind, target, metric, _value(kind, value)))
    return tuple(out)


def _value(kind: str, value: Any) -> float:
    if kind == "max_slowdown":
        from ..core.settings import parse_fraction

        try:
            return parse_fraction(value)
        except ValueError as exc:
            raise ConfigError(f"max_slowdown: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"min_speedup must be a factor > 0 such as 1.5, got {value!r}")
    return float(value)


def judge(budget: RelativeBudget, c: PairedComparison) -> BudgetOutcome:
    limit = budget.max_ratio
    status = "breached" if c.ci_low > limit else "met" if c.ci_high <= limit else "undecided"
    return BudgetOutcome(budget, c, status)


@dataclass(frozen=True)
class AgreementOutcome:
    """One output-agreement budget against the A/B's ``Agreement``."""

    budget: AgreementBudget
    limit: float
    agreement: Agreement
    status: str  # "met" | "breached" | "unavailable" (the last two fail the test)

    @property
    def measured(self) -> float | None:
        value: float | None = getattr(self.agreement, self.budget.figure)
        return value

    def line(self, a_name: str, b_name: str) -> str:
        """One line naming both sides, the figure and its sample, and the budget."""
        b, key = self.budget, f"{self.budget.key} {self.limit:g}"
        if self.status == "unavailable":
            return f"{key}: B [{b_name}] vs A [{a_name}]: agreement not available ({self.agreement.reason})"
        op = ("<=" if b.ceiling else ">=") if self.status == "met" else (">" if b.ceiling else "<")
        shown = f"{self.measured:.4g}" if b.ceiling else f"{self.measured:.4f}"
        verdict = "" if self.status == "breached" else ": met"
        return f"{b.label} of B [{b_name}] with A [{a_name}] {shown} {op} {key} ({self.agreement.sample}){verdict}"


def parse_agreement_budgets(**given: Any) -> tuple[tuple[AgreementBudget, float], ...]:
    """The output-agreement budgets given to ``compare()`` or the marker (None: not set); a
    ConfigError names what is wrong."""
    out = []
    for key, value in given.items():
        if value is None:
            continue
        budget = AGREEMENT_BUDGETS.get(key)
        if budget is None:
            raise ConfigError(f"unknown agreement budget {key!r}; use one of {', '.join(AGREEMENT_BUDGETS)}")
        high = 1.0 if budget.share else float("inf")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
            what = "a share between 0 and 1 such as 0.9" if budget.share else "a number >= 0 such as 0.01"
            raise ConfigError(f"{key} must be {what}, got {value!r}")
        out.append((budget, float(value)))
    return tuple(out)


def judge_agreement(budget: AgreementBudget, limit: float, agreement: Agreement) -> AgreementOutcome:
    if not agreement.available:
        return AgreementOutcome(budget, limit, agreement, "unavailable")
    measured = getattr(agreement, budget.figure)
    return AgreementOutcome(budget, limit, agreement, "met" if budget.holds(measured, limit) else "breached")
