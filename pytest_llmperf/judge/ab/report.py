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


def as_dict(r: ABResult) -> dict[str, Any]:
    """One A/B comparison as JSON values (the session JSON's ``ab`` entries): both sides'
    medians, every paired comparison and every relative budget's outcome."""
    import dataclasses

    def side(name: str, m: Any) -> dict[str, Any]:
        figures = {k: _finite(getattr(m, k)) for k in ("ttft_ms", "tpot_ms", "decode_tps", "e2e_ms")}
        return {"name": name, "engine": m.engine.describe(), "runs": m.n_runs, **figures}

    return {
        "label": r.label,
        "a": side(r.a_name, r.a),
        "b": side(r.b_name, r.b),
        "orders": list(r.orders),
        "comparisons": [{k: _finite(v) for k, v in dataclasses.asdict(c).items()} for c in r.comparisons],
        "budgets": [
            {"kind": o.budget.kind, "target": o.budget.target, "metric": o.budget.metric, "value": o.budget.value,
             "status": o.status, "line": o.line(r.a_name, r.b_name)}
            for o in r.budgets
        ],
        "failures": r.failure_lines(),
    }


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such a figure is written as null."""
    import math

    return None if isinstance(value, float) and not math.isfinite(value) else value
