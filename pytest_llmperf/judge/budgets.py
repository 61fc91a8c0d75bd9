"""Budgets: absolute ones on a Measurement (the marker's min_tps, p95_ms...) and relative ones on
an interleaved A/B's paired comparison (max_slowdown, min_speedup).

Like pytest-memray's markers: ``check_budgets`` returns None when every budget holds, and a
``BudgetFailure`` with ``as_longrepr()`` (the one-line reason) when one does not; the test's
``result.Outcome`` holds it while it is live.

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

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.stats import binom

from ..core.catalog import AGREEMENT_BUDGETS, BUDGETS, METRICS, PHASE_METRIC, AgreementBudget, Budget, direct_sample
from ..core.errors import ConfigError, did_you_mean, unknown_name
from ..core.formats import StrEnum, fmt, shown
from ..core.measurement import Agreement, Measurement
from ..core.values import MAX_NUMBER, parse_fraction
from .paired import PAIRED_METRICS, PairedComparison


def sample(budget: Budget, m: Measurement) -> str:
    """The sample behind a budget's statistic: pooled tokens (ITL) or runs."""
    if budget.pooled_tokens:
        return f"{m.itl.count} tokens, {m.n_runs} runs"
    return direct_sample(budget.metric, m) or f"{m.n_runs} runs"


#: Confidence of a budget statistic's interval (``statistic_ci``).
BUDGET_CI_LEVEL = 0.95


def quantile_of(statistic: str) -> float | None:
    """The quantile a budget's statistic is (``median`` 0.5, ``p95`` 0.95); None: not one."""
    if statistic == "median":
        return 0.5
    if statistic.startswith("p") and statistic[1:].isdigit():
        return int(statistic[1:]) / 100.0
    return None


def values_of(budget: Budget, m: Measurement) -> list[float] | None:
    """The values a budget's quantile is taken over: the pooled tokens' ITLs, or one value per
    run; None where the statistic is not a quantile of such a sample."""
    if quantile_of(budget.statistic) is None:
        return None
    if budget.pooled_tokens:
        return [v for r in m.runs for v in r.itl_ms]
    run_field = METRICS[budget.metric].run_field
    if run_field is None:
        return None
    values = [getattr(r, run_field) for r in m.runs]
    return [float(v) for v in values if isinstance(v, (int, float))] if values else None


def order_ci(values: list[float], q: float, level: float = BUDGET_CI_LEVEL) -> tuple[float | None, float | None]:
    """Distribution-free CI of the ``q`` quantile from order statistics (coverage >= ``level``
    for independent values): the k-th smallest value bounds it from below where P(Bin(n, q) <
    k) <= (1 - level) / 2, and likewise from above. None on a side the sample cannot bound
    (p99 of 20 runs: the upper bound would lie past the largest run)."""
    n = len(values)
    if n == 0:
        return None, None
    s = sorted(values)
    tail = (1.0 - level) / 2.0
    cdf = binom.cdf(range(n + 1), n, q)  # cdf[j] = P(B <= j)
    # Lower: the largest k (1-based) with P(B <= k - 1) <= tail.
    lows = [k for k in range(1, n + 1) if cdf[k - 1] <= tail]
    # Upper: the smallest k with P(B <= k - 1) >= 1 - tail.
    highs = [k for k in range(1, n + 1) if cdf[k - 1] >= 1.0 - tail]
    return (s[lows[-1] - 1] if lows else None), (s[highs[0] - 1] if highs else None)


def runs_to_bound(q: float, level: float = BUDGET_CI_LEVEL) -> int:
    """The fewest values whose largest bounds the ``q`` quantile from above at ``level``
    (1 - q^n >= 1 - tail): 367 for a p99, 72 for a p95, 6 for a median."""
    tail = (1.0 - level) / 2.0
    return max(1, math.ceil(math.log(tail) / math.log(q))) if 0 < q < 1 else 1


class BudgetState(StrEnum):
    """What one budget's sample shows: met (its whole CI within the limit), breached (its whole
    CI beyond it: fails the test) or undecided (the CI straddles the limit: passes, and says so).
    An A/B's output-agreement budget is met, breached or unavailable (no agreement could be
    computed: fails the test too)."""

    MET = "met"
    BREACHED = "breached"
    UNDECIDED = "undecided"
    UNAVAILABLE = "unavailable"

    @property
    def fails(self) -> bool:
        return FAILS[self]


#: Whether a budget state fails its test.
FAILS = {
    BudgetState.MET: False,
    BudgetState.BREACHED: True,
    BudgetState.UNDECIDED: False,
    BudgetState.UNAVAILABLE: True,
}


class BudgetStatus(StrEnum):
    """All of one measurement's budgets together (``result.Outcome.budget``): NONE
    (``-``: it has none), OK (none breached) or FAIL (some breached: over budget)."""

    NONE = "-"
    OK = "ok"
    FAIL = "FAIL"

    @classmethod
    def of(cls, n_budgets: int, breached: bool) -> BudgetStatus:
        return cls.NONE if not n_budgets else cls.FAIL if breached else cls.OK

    def cell(self, breached: Sequence[str]) -> str:
        """The summary table's cell: ``-``, ``ok`` or ``FAIL key,key`` (the breached keys)."""
        return f"{self} {','.join(breached)}" if self is BudgetStatus.FAIL else str(self)

    @classmethod
    def of_cell(cls, cell: str) -> BudgetStatus:
        """The status a ``cell`` shows (its first word; anything else: NONE): ``cell``'s inverse,
        for a reader of a printed table. The package reads no cell back (it counts
        ``MeasurementResult.over_budget``)."""
        word = cell.split(" ", 1)[0]
        return next((s for s in cls if s.value == word), cls.NONE)


@dataclass(frozen=True)
class BudgetBreach:
    key: str
    label: str
    unit: str
    ceiling: bool
    measured: float | None
    budget: float
    sample: str
    #: The statistic's 95% CI from its sample (order statistics; None on a side the sample
    #: cannot bound), or None where the statistic has none (an exact figure, a share).
    ci: tuple[float | None, float | None] | None = None
    state: BudgetState = BudgetState.BREACHED
    #: The quantile the statistic is (0.99 for a p99), where it is one.
    quantile: float | None = None
    n: int = 0
    #: Breached by its value alone: the sample was too small for its CI to show a breach.
    by_value: bool = False

    def line(self) -> str:
        if self.measured is None:
            return f"{self.label} was not measured by this engine (budget {self.key}={fmt(self.budget)})"
        if self.state is BudgetState.UNDECIDED:
            return self._undecided_line()
        op = ">" if self.ceiling else "<"
        how = ": its value decides" if self.by_value else ""
        return (
            f"{self.label} {fmt(self.measured)} {self.unit} {op} budget {fmt(self.budget)} {self.unit} "
            f"({self._ci_text()}{self.sample}{self._estimable()}{how})"
        )

    def _estimable(self) -> str:
        """``; 20 runs cannot estimate a p99 at 95% (about 368 bound it)`` where the sample
        leaves a side of the statistic's CI unbounded, else ''."""
        if self.ci is None or self.quantile is None or None not in self.ci:
            return ""
        q = self.quantile
        need = max(runs_to_bound(q), runs_to_bound(1.0 - q))
        name = "median" if q == 0.5 else f"p{q * 100:g}"
        what = "tokens" if "tokens" in self.sample else "runs"
        return f"; {self.n} {what} cannot estimate a {name} at {BUDGET_CI_LEVEL:.0%} (about {need} bound it)"

    @property
    def worth_more_runs(self) -> bool:
        """More runs may decide it: its CI straddles the limit, or it broke the limit by its
        value alone (too few runs for a CI)."""
        return self.state is BudgetState.UNDECIDED or self.by_value

    def _ci_text(self) -> str:
        if self.ci is None or self.ci == (None, None):
            return ""
        low, high = self.ci
        lo = "-inf" if low is None else fmt(low)
        hi = "+inf" if high is None else fmt(high)
        return f"{BUDGET_CI_LEVEL:.0%} CI {lo}..{hi}, "

    def _undecided_line(self) -> str:
        """``TTFT p95 43.9 ms, 95% CI 41.0..47.2, within 45 by less than its uncertainty``."""
        assert self.measured is not None
        ok = self.measured <= self.budget if self.ceiling else self.measured >= self.budget
        side = "within" if ok else ("over" if self.ceiling else "under")
        ci = self._ci_text()
        return (
            f"{self.label} {fmt(self.measured)} {self.unit}{', ' + ci[:-2] if ci else ''}, {side} "
            f"{fmt(self.budget)} by less than its uncertainty ({self.sample}{self._estimable()}; undecided: passes)"
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


def against_agreement(m: Measurement, given: Mapping[str, object]) -> tuple[tuple[AgreementBreach, ...], int]:
    """(the breaches, how many budgets) of the marker's agreement budgets (``given``: its A/B
    keys) on a measurement judged against REF (``m.agreement``; None: it was not compared)."""
    budgets = parse_agreement_budgets(**{k: given.get(k) for k in AGREEMENT_BUDGETS})
    agreement = m.agreement or Agreement(reason="not compared with REF")
    outcomes = [judge_agreement(budget, limit, agreement) for budget, limit in budgets]
    breaches = tuple(AgreementBreach(o.budget.key, o.line("REF", "this tree")) for o in outcomes if o.status.fails)
    return breaches, len(budgets)


def judge_budget(key: str, limit: float, m: Measurement) -> BudgetBreach:
    """One budget against its statistic and, where the statistic is a quantile of runs or
    tokens, that quantile's 95% CI (docs/settings.md, "Budgets and their uncertainty"):

    - met: the whole CI holds (where the sample cannot bound the CI on that side, its most
      extreme value holds);
    - breached (fails the test): the whole CI breaks it, or nothing was measured; where the
      sample is too small to bound the other side at all, the value decides (and says so);
    - undecided (passes, and says so): the CI straddles the limit.

    A statistic with no sample CI (a buffer size, a share) is decided by its value."""
    b = BUDGETS[key]
    measured = b.read(m)
    out = BudgetBreach(key, b.label, b.unit, b.ceiling, measured, limit, sample(b, m))
    if measured is None:
        return out
    q = quantile_of(b.statistic)
    values = values_of(b, m)
    if q is None or not values:
        return dataclasses.replace(out, ci=None, state=BudgetState.MET if b.holds(measured, limit) else out.state)
    low, high = order_ci(values, q)
    state, by_value = _ci_state(b, measured, limit, values, (low, high))
    return dataclasses.replace(out, ci=(low, high), state=state, quantile=q, n=len(values), by_value=by_value)


def _ci_state(
    b: Budget, measured: float, limit: float, values: Sequence[float], ci: tuple[float | None, float | None]
) -> tuple[BudgetState, bool]:
    """(the state, whether the value decided it) of a budget whose statistic has the sample CI ``ci``."""
    low, high = ci
    # The side of the CI that must hold for the budget to be met, and the side that must break it.
    holds_side, breaks_side = (high, low) if b.ceiling else (low, high)
    # A side the sample cannot bound (p99 of 20 runs) is met when even its most extreme value
    # holds: a budget far from the measured values needs no more runs to say so.
    edge = max(values) if b.ceiling else min(values)
    if b.holds(edge if holds_side is None else holds_side, limit):
        return BudgetState.MET, False
    if breaks_side is None:  # too few values to show a breach at all: the value decides
        by_value = not b.holds(measured, limit)
        return (BudgetState.BREACHED if by_value else BudgetState.UNDECIDED), by_value
    return (BudgetState.BREACHED if not b.holds(breaks_side, limit) else BudgetState.UNDECIDED), False


def budget_checks(m: Measurement, budgets: Mapping[str, float]) -> tuple[BudgetBreach, ...]:
    """Every budget of ``m`` judged (``judge_budget``), in the marker's order."""
    return tuple(judge_budget(key, limit, m) for key, limit in budgets.items())


def undecided_budgets(m: Measurement, budgets: Mapping[str, float]) -> tuple[BudgetBreach, ...]:
    """The budgets whose CI straddles their limit (they pass, and say so)."""
    return tuple(c for c in budget_checks(m, budgets) if c.state is BudgetState.UNDECIDED)


def budgets_worth_more_runs(m: Measurement, budgets: Mapping[str, float]) -> bool:
    """Some budget that more runs may decide (``BudgetBreach.worth_more_runs``)."""
    return any(c.worth_more_runs for c in budget_checks(m, budgets))


def check_budgets(
    m: Measurement, budgets: Mapping[str, float], also: tuple[AgreementBreach, ...] = ()
) -> BudgetFailure | None:
    """The budgets ``m`` broke (``also``: agreement budgets against REF, judged already): those
    whose whole CI lies beyond the limit, or whose figure was not measured."""
    breaches: list[BudgetBreach | AgreementBreach] = [
        c for c in budget_checks(m, budgets) if c.state is BudgetState.BREACHED
    ]
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
            digits = ".0%" if self.value * 100 == round(self.value * 100) else ".1%"
            return f"max_slowdown {self.value:{digits}}"
        return f"min_speedup {self.value:g}x"


@dataclass(frozen=True)
class BudgetOutcome:
    budget: RelativeBudget
    comparison: PairedComparison
    status: BudgetState  # MET, BREACHED or UNDECIDED

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
        word = {
            BudgetState.BREACHED: "breaks",
            BudgetState.MET: "meets",
            BudgetState.UNDECIDED: "cannot show it meets",
        }[self.status]
        return f"{b.target}: B [{b_name}] vs A [{a_name}]: {shown}: {word} {b.describe()}"


def parse_budgets(max_slowdown: object = None, min_speedup: object = None) -> tuple[RelativeBudget, ...]:
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
                    f"{kind}: unknown phase or metric {target!r}{did_you_mean(target, (*PHASE_METRIC, *PAIRED_METRICS))}; "
                    f"use prefill, decode or one of {', '.join(PAIRED_METRICS)}"
                )
            out.append(RelativeBudget(kind, target, metric, _value(kind, value)))
    return tuple(out)


def _value(kind: str, value: object) -> float:
    if kind == "max_slowdown":
        try:
            return parse_fraction(value)
        except ValueError as exc:
            raise ConfigError(f"max_slowdown: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_NUMBER:
        raise ConfigError(f"min_speedup must be a factor > 0 such as 1.5, at most {MAX_NUMBER:g}, got {shown(value)}")
    return float(value)


def judge(budget: RelativeBudget, c: PairedComparison) -> BudgetOutcome:
    limit = budget.max_ratio
    if c.ci_low > limit:
        return BudgetOutcome(budget, c, BudgetState.BREACHED)
    return BudgetOutcome(budget, c, BudgetState.MET if c.ci_high <= limit else BudgetState.UNDECIDED)


@dataclass(frozen=True)
class AgreementOutcome:
    """One output-agreement budget against the A/B's ``Agreement``."""

    budget: AgreementBudget
    limit: float
    agreement: Agreement
    status: BudgetState  # MET, BREACHED or UNAVAILABLE (the last two fail the test)

    @property
    def measured(self) -> float | None:
        value: float | None = getattr(self.agreement, self.budget.figure)
        return value

    def line(self, a_name: str, b_name: str) -> str:
        """One line naming both sides, the figure and its sample, and the budget."""
        b, key = self.budget, f"{self.budget.key} {self.limit:g}"
        if self.status is BudgetState.UNAVAILABLE:
            return f"{key}: B [{b_name}] vs A [{a_name}]: agreement not available ({self.agreement.reason})"
        op = ("<=" if b.ceiling else ">=") if self.status is BudgetState.MET else (">" if b.ceiling else "<")
        shown = f"{self.measured:.4g}" if b.ceiling else f"{self.measured:.4f}"
        verdict = "" if self.status is BudgetState.BREACHED else ": met"
        return f"{b.label} of B [{b_name}] with A [{a_name}] {shown} {op} {key} ({self.agreement.sample}){verdict}"


def parse_agreement_budgets(**given: object) -> tuple[tuple[AgreementBudget, float], ...]:
    """The output-agreement budgets given to ``compare()`` or the marker (None: not set); a
    ConfigError names what is wrong."""
    out = []
    for key, value in given.items():
        if value is None:
            continue
        budget = AGREEMENT_BUDGETS.get(key)
        if budget is None:
            raise ConfigError(unknown_name("agreement budget", key, AGREEMENT_BUDGETS))
        high = 1.0 if budget.share else MAX_NUMBER
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
            what = (
                "a share between 0 and 1 such as 0.9"
                if budget.share
                else f"a number >= 0 such as 0.01, at most {high:g}"
            )
            raise ConfigError(f"{key} must be {what}, got {shown(value)}")
        out.append((budget, float(value)))
    return tuple(out)


def judge_agreement(budget: AgreementBudget, limit: float, agreement: Agreement) -> AgreementOutcome:
    if not agreement.available:
        return AgreementOutcome(budget, limit, agreement, BudgetState.UNAVAILABLE)
    state = BudgetState.MET if budget.holds(getattr(agreement, budget.figure), limit) else BudgetState.BREACHED
    return AgreementOutcome(budget, limit, agreement, state)
