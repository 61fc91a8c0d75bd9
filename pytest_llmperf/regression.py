"""A candidate record against its baseline record: statistics per metric family, per phase.

Core, no pytest: the plugin and ``llmperf compare`` both call ``compare_records``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .compare import METRICS, Comparison, Verdict, compare_runs, compare_tail, decide
from .fingerprint import subject_changes
from .layer_diff import LayerChange, compare_layers
from .records import same_workload

DEFAULT_ALPHA = 0.01
DEFAULT_THRESHOLD = 0.05
DEFAULT_TAIL_THRESHOLD = 0.10
TAIL_QUANTILE = 0.95


@dataclass(frozen=True)
class CompareSettings:
    alpha: float = DEFAULT_ALPHA
    threshold: float = DEFAULT_THRESHOLD
    tail_threshold: float = DEFAULT_TAIL_THRESHOLD
    #: Comparisons in the whole session (Holm's m); unseen ones count as p = 1, which bounds
    #: the session-wide Holm adjustment from above, so a test can fail before the session ends.
    family_size: int | None = None
    fail_unstable: bool = False
    seed: int = 0


@dataclass(frozen=True)
class BaselineVerdict:
    """What the baseline says about one measurement."""

    status: str  # compared | no-baseline | other-hardware | workload-changed | error
    note: str = ""
    comparisons: tuple[Comparison, ...] = ()
    changes: tuple[str, ...] = ()
    fail_unstable: bool = False
    #: Per-layer diff when both records carry layer timing (a diagnosis, not a gate).
    layer_changes: tuple[LayerChange, ...] = ()

    @property
    def slower_layers(self) -> tuple[LayerChange, ...]:
        return tuple(c for c in self.layer_changes if c.slower)

    @property
    def regressions(self) -> tuple[Comparison, ...]:
        bad = {Verdict.REGRESSION} | ({Verdict.UNSTABLE} if self.fail_unstable else set())
        return tuple(c for c in self.comparisons if c.verdict in bad)

    def failure_lines(self) -> list[str]:
        suffix = f"; {', '.join(self.changes)}" if self.changes else ""
        lines = [c.line() + suffix for c in self.regressions]
        if lines and self.slower_layers:
            lines.append("slower layers: " + "; ".join(c.line() for c in self.slower_layers))
        return lines

    def short(self) -> str:
        """One cell for the summary table."""
        if self.status != "compared":
            return self.status
        if self.regressions:
            return "REGRESSION " + "+".join(sorted({c.phase for c in self.regressions}))
        verdicts = {c.verdict for c in self.comparisons}
        for v in (Verdict.UNSTABLE, Verdict.IMPROVED, Verdict.INSUFFICIENT):
            if v in verdicts:
                return v.value
        return Verdict.UNCHANGED.value


def compare_records(
    baseline: Mapping[str, Any], candidate: Mapping[str, Any], settings: CompareSettings
) -> list[Comparison]:
    """Every metric family both records carry, decided with Holm over ``family_size``."""
    comparisons = []
    for name, spec in METRICS.items():
        if spec.tail:
            if baseline.get("itl_ms") and candidate.get("itl_ms"):
                comparisons.append(
                    compare_tail(
                        spec,
                        baseline["itl_ms"],
                        candidate["itl_ms"],
                        q=TAIL_QUANTILE,
                        threshold=settings.tail_threshold,
                        alpha=settings.alpha,
                        seed=settings.seed,
                    )
                )
        elif name in baseline["runs"] and name in candidate["runs"]:
            comparisons.append(
                compare_runs(
                    spec,
                    baseline["runs"][name],
                    candidate["runs"][name],
                    threshold=settings.threshold,
                    alpha=settings.alpha,
                    seed=settings.seed,
                )
            )
    family = max(settings.family_size or 0, len(comparisons)) or None
    return decide(comparisons, alpha=settings.alpha, m=family, fail_unstable=settings.fail_unstable)


def judge(
    entries: Mapping[str, Mapping[str, Any]] | None,
    hardware_key: str,
    candidate: Mapping[str, Any],
    settings: CompareSettings,
) -> BaselineVerdict:
    """Find this hardware's entry among a test's baselines and compare, or say why not."""
    if not entries:
        return BaselineVerdict("no-baseline", "no baseline: run with --llmperf-update-baselines")
    baseline = entries.get(hardware_key)
    if baseline is None:
        return BaselineVerdict(
            "other-hardware",
            f"not comparable here: baselines exist only for other hardware ({', '.join(sorted(entries))}); "
            f"this machine is {hardware_key}; record one with --llmperf-update-baselines",
        )
    changed = same_workload(baseline, candidate)
    if changed:
        return BaselineVerdict(
            "workload-changed",
            f"not comparable: the workload changed since the baseline ({', '.join(changed)}); "
            "re-record with --llmperf-update-baselines",
        )
    changes = tuple(subject_changes(baseline.get("subject", {}), candidate.get("subject", {})))
    return BaselineVerdict(
        "compared",
        comparisons=tuple(compare_records(baseline, candidate, settings)),
        changes=changes,
        fail_unstable=settings.fail_unstable,
        layer_changes=compare_layers(baseline, candidate, alpha=settings.alpha, threshold=settings.threshold),
    )

