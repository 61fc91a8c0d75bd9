"""The terminal summary at the end of a session, as lines: ``("line", text)``, or a separator
``("sep", title)`` / ``("alarm", title)`` (red) that the pytest layer draws."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .config import SessionSettings
from .finish import Outputs

Line = tuple[str, str]


def summary(
    s: SessionSettings,
    rows: Sequence[Mapping[str, Any]],
    results: Sequence[Any],  # judge.result.MeasurementResult
    out: Outputs | None,
    suite_failures: Sequence[str],
    *,
    verbosity: int,
    width: int,
    notes: Sequence[str] = (),
) -> list[Line]:
    """Every line of the llmperf part of the terminal summary, for pytest's ``verbosity``
    (-q: a count, -qq: nothing but errors) and the terminal's ``width``."""
    lines: list[Line] = [("line", note) for note in notes]
    if out is not None:
        lines += [("line", line) for line in out.baseline_errors]
        if out.baseline_errors:
            lines.append(("line", f"llmperf: {len(out.baseline_errors)} baseline file(s) not written: the session fails"))
        lines += [("line", line) for line in out.report_errors]
        if out.html_error:
            lines.append(("line", out.html_error))
        elif out.html_written:
            lines.append(("line", f"llmperf: HTML report written to {out.html_written}"))
        if out.report_errors or out.html_error:
            n = len(out.report_errors) + bool(out.html_error)
            lines.append(("line", f"llmperf: {n} report file(s) not written: the session fails"))
        lines += [("line", line) for line in out.write_errors]
        if out.history_line and (verbosity >= 0 or "not written" in out.history_line):
            lines.append(("line", out.history_line))
        if out.other_hardware_line:
            lines.append(("line", out.other_hardware_line))
    if suite_failures:
        lines.append(("alarm", "llmperf: slower than the rest of the suite (fails the session)"))
        lines += [("line", line) for line in suite_failures]
    if not rows or verbosity <= -2:
        return lines
    if s.disable:
        return lines + [("line", f"llmperf: {len(rows)} measurement(s) run once (--llmperf-disable): "
                                 "no budgets, statistics or baselines")]
    from ..reports.session_file import against_of, comparison_table, reach_lines, reach_summary, undecided_lines

    if verbosity == -1:
        over = sum(1 for r in rows if str(r.get("budget", "")).startswith("FAIL"))
        ref = f", judged against {against_of(results)}" if against_of(results) else ""
        lines.append(("line", f"llmperf: {len(rows)} measurement(s){ref}, {over} over budget (drop -q for the table)"))
        return lines + [("line", line) for line in undecided_lines(results, short=True)]
    from ..reports.text import overhead_lines
    from ..reports.text import short_ids, summary_table

    lines += [("sep", "llmperf summary"), ("line", summary_table(rows, s.columns, width))]
    lines += [("line", line) for line in overhead_lines(rows)]
    table = comparison_table(results, s.columns, width)
    if table:
        against = against_of(results)
        lines += [("sep", f"llmperf comparison against {against}" if against else "llmperf baseline comparison"),
                  ("line", table)]
        if against and " REF " not in table.splitlines()[0] + " ":
            lines.append(("line", "llmperf: both sides' figures: a wider terminal or --llmperf-columns "
                                  "baseline,now,change,ci,verdict (the JSON, Markdown and HTML reports have them)"))
        lines += [("line", line) for line in undecided_lines(results, short=True)]
        if verbosity >= 1:  # the "detects" column's figures, with where the noise estimate came from
            lines += [("line", line) for line in reach_lines(results, short=True)]
        else:
            reach = reach_summary(results)
            lines += [("line", reach)] if reach else []
    short = short_ids([r.test for r in results])
    notes = sorted(
        {
            f"{short[r.test]}: {r.verdict.note}"
            for r in results
            if r.verdict is not None and r.verdict.note and not s.update_baselines and r.verdict.status != "error"
        }
    )
    lines += [("line", note) for note in notes]
    for path, moved in out.written if out is not None else []:
        lines.append(("line", f"llmperf: baselines written to {path}"))
        if moved is not None:
            lines.append(("line", f"llmperf: the unreadable old file was kept as {moved}"))
    return lines
