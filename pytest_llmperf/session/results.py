"""What one test's measurements put on its report: JUnit properties, a text section per
measurement, the lines that fail it, and the results (``judge.result.MeasurementResult``) that
the session collects (as JSON only across pytest-xdist's wire) and writes to the session JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..judge.ab import ABResult
    from ..judge.budgets import BudgetFailure
    from ..judge.result import MeasurementResult
    from ..measuring.metrics import Measurement
    from .assess import Assessment


@dataclass(frozen=True)
class Result:
    """One measurement of a test, as ``pytest_llmperf_result`` sees it."""

    measurement: Measurement
    failure: BudgetFailure | None
    n_budgets: int
    baseline: Assessment | None = None  # the session's baseline comparison
    budgets: Mapping[str, float] = field(default_factory=dict)  # the marker's, drawn as lines in the HTML report
    #: What a ``pytest_llmperf_result`` hook attached (JSON values): the JSON report's ``extra_info``.
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    #: One line per budget its sample could not decide (``judge.budgets.undecided_budgets``).
    budget_notes: tuple[str, ...] = ()


def ab_result_of(nodeid: str, ab: ABResult) -> dict[str, Any]:
    """The session JSON's entry of one A/B comparison."""
    from ..judge.ab import as_dict

    return {"test": nodeid + (f"[{ab.label}]" if ab.label else ""), "nodeid": nodeid, **as_dict(ab)}


def section_of(r: Result, t: MeasurementResult, columns: Sequence[str], width: int) -> tuple[str, str]:
    """The report section of one measurement (``r``, its typed result ``t``): its figures,
    then its baseline comparison."""
    from ..reports.text import metrics_table

    m, a = r.measurement, r.baseline
    title = "llmperf" + (f" [{m.label}]" if m.label else "")
    detail = metrics_table(m)
    if a is not None and a.verdict is not None:
        from ..reports.session_file import comparison_table, undecided_lines

        shown = [dataclasses.replace(t, test=a.key)]
        table = comparison_table(shown, columns, width)
        undecided = undecided_lines(shown)
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
    if t.budget_notes:
        detail += "\n\n" + "\n".join(f"budget undecided: {line}" for line in t.budget_notes)
    return title, detail.rstrip()


@dataclass
class CallReport:
    """What the call phase's report gets: ``properties`` go on the item before the report is
    made (JUnit reads them from every later report), the rest on the report itself."""

    properties: list[tuple[str, Any]] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # non-empty: the test fails with them
    #: The typed results (``judge.result``): in this process as they are; ``to_json()`` only where
    #: a report crosses pytest-xdist's wire (``pytest_plugin.plugin``'s report hooks).
    shipped: list[MeasurementResult] = field(default_factory=list)
    ab: list[dict[str, Any]] = field(default_factory=list)


def call_report(
    nodeid: str,
    results: Sequence[Result],
    ab_results: Sequence[ABResult],
    *,
    columns: Sequence[str],
    width: int,
    budgets_gate: bool,
    failure_lines: Callable[[Assessment], list[str]],
    hook_error: str | None = None,
) -> CallReport:
    """One test's measurements (after ``pytest_llmperf_result``) and A/B comparisons as report
    parts; ``failure_lines(assessment)``: the baseline's failure lines of one measurement."""
    from ..judge.result import result_of

    out = CallReport(lines=[hook_error] if hook_error else [])
    if ab_results:
        from ..judge.ab import properties as ab_properties

        out.properties += ab_properties(ab_results)
        out.ab = [ab_result_of(nodeid, ab) for ab in ab_results]
    typed = [result_of(nodeid, r) for r in results]  # judge.result: what every report reads
    for t in typed:
        out.properties += t.properties()
    for r, t in zip(results, typed):
        out.sections.append(section_of(r, t, columns, width))
        if r.failure is not None and budgets_gate:
            out.lines.append(r.failure.as_longrepr())
        if r.baseline is not None:
            out.lines += failure_lines(r.baseline)
        out.shipped.append(t)
    return out
