"""What one test's measurements put on its report: JUnit properties, a text section per
measurement, the lines that fail it, and the plain result dicts that cross pytest-xdist's
wire and become the session JSON (``result_of``: their one construction)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from ..judge.budgets import BudgetFailure
    from ..measuring.metrics import Measurement


@dataclass(frozen=True)
class Result:
    """One measurement of a test, as ``pytest_llmperf_result`` sees it."""

    measurement: "Measurement"
    failure: "BudgetFailure | None"
    n_budgets: int
    baseline: Any = None  # the session's ``assess.Assessment`` (baseline comparison)
    budgets: Mapping[str, float] = field(default_factory=dict)  # the marker's, drawn as lines in the HTML report
    #: What a ``pytest_llmperf_result`` hook attached (JSON values): the JSON report's ``extra_info``.
    extra_info: Mapping[str, Any] = field(default_factory=dict)


def result_of(nodeid: str, r: Any) -> dict[str, Any]:
    """The session JSON's entry of one assessed measurement (``r``: a ``fixture.Result`` whose
    ``baseline`` is an ``assess.Assessment``); plain data, so it crosses xdist's wire."""
    from ..reports.session_file import verdict_dict

    m, a = r.measurement, r.baseline
    return {
        "test": nodeid + (f"[{m.label}]" if m.label else ""),
        "nodeid": nodeid,
        "label": m.label or "",
        "key": a.key,
        "baseline_file": a.baseline_file,
        "hardware_key": a.hardware_key,
        "record": a.record,
        "budget": "-" if not r.n_budgets else ("FAIL" if r.failure else "ok"),
        "budget_failures": [b.line() for b in r.failure.breaches] if r.failure else [],
        "verdict": verdict_dict(a.verdict),
        "baseline_record": a.baseline_record,
        "budgets": dict(r.budgets),
        "extra_info": dict(r.extra_info),
    }


def ab_result_of(nodeid: str, ab: Any) -> dict[str, Any]:
    """The session JSON's entry of one A/B comparison (``judge.ab.ABResult``)."""
    from ..judge.ab.report import as_dict

    return {"test": nodeid + (f"[{ab.label}]" if ab.label else ""), "nodeid": nodeid, **as_dict(ab)}


def properties_of(r: Any) -> list[tuple[str, Any]]:
    """JUnit properties of one measurement: its figures, then its baseline verdict."""
    from ..reports.text import properties

    m = r.measurement
    props = properties(m, r.failure, r.n_budgets)
    if r.baseline is not None and r.baseline.verdict is not None:
        prefix = f"llmperf[{m.label}]." if m.label else "llmperf."
        props.append((prefix + "baseline", r.baseline.verdict.short()))
        props += [(f"{prefix}verdict.{c.metric}", c.verdict.value) for c in r.baseline.verdict.comparisons]
    return props


def section_of(r: Any, columns: Sequence[str], width: int) -> tuple[str, str]:
    """The report section of one measurement: its figures, then its baseline comparison."""
    from ..reports.text import metrics_table

    m, a = r.measurement, r.baseline
    title = "llmperf" + (f" [{m.label}]" if m.label else "")
    detail = metrics_table(m)
    if a is not None and a.verdict is not None:
        from ..reports.session_file import comparison_table, undecided_lines, verdict_dict

        one = [{"test": a.key, "verdict": verdict_dict(a.verdict)}]
        table = comparison_table(one, columns, width)
        undecided = undecided_lines(one)
        # An error note is the test's failure line already: not a second copy here.
        extra = [a.verdict.note] if a.verdict.note and a.verdict.status != "error" else []
        if a.verdict.changes:
            extra.append("changed since the baseline: " + ", ".join(a.verdict.changes))
        if a.verdict.layer_changes:
            slower = a.verdict.slower_layers
            extra.append(
                "slower layers: " + "; ".join(c.line() for c in slower)
                if slower
                else f"per-layer diff: no layer significantly slower ({len(a.verdict.layer_changes)} compared)"
            )
        detail += "\n\n" + "\n".join(extra + ([table] if table else []) + undecided)
    return title, detail.rstrip()


@dataclass
class CallReport:
    """What the call phase's report gets: ``properties`` go on the item before the report is
    made (JUnit reads them from every later report), the rest on the report itself."""

    properties: list[tuple[str, Any]] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # non-empty: the test fails with them
    shipped: list[dict[str, Any]] = field(default_factory=list)
    ab: list[dict[str, Any]] = field(default_factory=list)


def call_report(
    nodeid: str,
    results: Sequence[Any],
    ab_results: Sequence[Any],
    *,
    columns: Sequence[str],
    width: int,
    budgets_gate: bool,
    failure_lines: Callable[[Any], list[str]],
    hook_error: str | None = None,
) -> CallReport:
    """One test's measurements (after ``pytest_llmperf_result``) and A/B comparisons as report
    parts; ``failure_lines(assessment)``: the baseline's failure lines of one measurement."""
    out = CallReport(lines=[hook_error] if hook_error else [])
    if ab_results:
        from ..judge.ab.report import properties as ab_properties

        out.properties += ab_properties(ab_results)
        out.ab = [ab_result_of(nodeid, ab) for ab in ab_results]
    for r in results:
        out.properties += properties_of(r)
    for r in results:
        out.sections.append(section_of(r, columns, width))
        if r.failure is not None and budgets_gate:
            out.lines.append(r.failure.as_longrepr())
        if r.baseline is not None:
            out.lines += failure_lines(r.baseline)
            out.shipped.append(result_of(nodeid, r))
    return out
