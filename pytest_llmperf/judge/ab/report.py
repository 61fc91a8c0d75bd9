"""A/B results on a pytest report: a section per comparison, one failure line per breached
budget, JUnit properties. Plain attribute work: no pytest import."""

from __future__ import annotations

from typing import Any, Sequence

from .run import ABResult


def properties(results: Sequence[ABResult]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for r in results:
        prefix = f"llmperf.ab[{r.label}]." if r.label else "llmperf.ab."
        for c in r.comparisons:
            out += [(f"{prefix}{c.metric}.ratio", round(c.ratio, 6)),
                    (f"{prefix}{c.metric}.ci", f"{c.ci_low:.6g}..{c.ci_high:.6g}")]
        out += [(f"{prefix}budget.{o.budget.kind}.{o.budget.target}", o.status) for o in r.budgets]
    return out


def attach(report: Any, results: Sequence[ABResult]) -> Any:
    """Sections and failure lines on ``report`` (a pytest TestReport of the call phase)."""
    lines: list[str] = []
    for r in results:
        report.sections.append(("llmperf A/B" + (f" [{r.label}]" if r.label else ""), "\n".join(r.lines())))
        lines += r.failure_lines()
    if lines and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(lines)
    elif lines and report.failed and isinstance(report.longrepr, str):
        report.longrepr += "\n" + "\n".join(lines)
    return report
