"""The end of a session, in the process that owns it (never an xdist worker): baselines
written when asked, the history appended, the JSON/HTML/Markdown reports and the CI step
summary. A file that cannot be written costs one line. A file the session was asked for (a
baseline under ``--llmperf-update-baselines``, the JSON, HTML or Markdown report) also fails
the session (``Outputs.failed``): CI must not pass with its evidence missing. A baseline's old
file is left as it was. The history and GitHub's step summary cost their line only.

The terminal summary at the end of a session, as lines: ``("line", text)``, or a separator
``("sep", title)`` / ``("alarm", title)`` (red) that the pytest layer draws."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.documents import write_output
from ..core.errors import LLMPerfError
from ..history import keep
from .options import SessionSettings

if TYPE_CHECKING:
    from ..judge.result import MeasurementResult


@dataclass
class Outputs:
    """What the end of the session wrote, and the one line of each thing it could not write."""

    written: list[tuple[Path, Path | None]] = field(default_factory=list)  # baseline file, moved-aside copy
    write_errors: list[str] = field(default_factory=list)
    baseline_errors: list[str] = field(default_factory=list)
    report_errors: list[str] = field(default_factory=list)  # --llmperf-json / -markdown
    history_line: str | None = None
    html_written: Path | None = None
    html_error: str | None = None
    #: Measurements not compared because their baselines are all from other hardware: the
    #: summary line, and whether it fails the session (``--llmperf-fail-other-hardware``).
    other_hardware_line: str | None = None
    other_hardware_fails: bool = False

    @property
    def failed(self) -> bool:
        """A file asked for was not written, or (when asked) a test was not compared: the
        session fails."""
        return bool(self.baseline_errors or self.report_errors or self.html_error or self.other_hardware_fails)


#: How many differing fingerprint fields the other-hardware line names before "...".
SHOWN_DIFFERENCES = 4


def other_hardware_line(s: SessionSettings, results: Sequence[MeasurementResult]) -> tuple[str | None, bool]:
    """The one summary line for the measurements whose baselines were all recorded on other
    hardware (how many, and the fingerprint fields that differ), and whether it fails the
    session; (None, False) when there are none or the session records baselines."""
    if s.update_baselines or not s.compare:
        return None, False
    from ..judge.verdict import BaselineStatus

    other = [r.verdict for r in results if r.verdict is not None and r.verdict.status is BaselineStatus.OTHER_HARDWARE]
    if not other:
        return None, False
    why = shown_differences([d for v in other for d in v.changes])
    fails = s.fail_other_hardware
    line = (
        f"llmperf: {len(other)} of {len(results)} measurement(s) not compared: their baselines were recorded on "
        f"other hardware ({why or 'hardware keys differ'}); record them here with --llmperf-update-baselines, "
        "or run both sides in one session on a runner that changes CPU (docs/ab.md)"
        + ("; the session fails (--llmperf-fail-other-hardware)" if fails else "")
    )
    return line, fails


def shown_differences(differences: Sequence[str]) -> str:
    """The differing fingerprint fields, each once, the first ``SHOWN_DIFFERENCES`` of them."""
    fields = list(dict.fromkeys(differences))
    return "; ".join(fields[:SHOWN_DIFFERENCES]) + ("; ..." if len(fields) > SHOWN_DIFFERENCES else "")


def write_file(path: Path, text: str, errors: list[str]) -> None:
    try:
        write_output(path, text)
    except OSError as exc:
        errors.append(f"llmperf: cannot write {path}: {exc.strerror or exc}")


def finish(
    s: SessionSettings,
    results: Sequence[MeasurementResult],
    ab_results: Sequence[Mapping[str, object]],
    started_at: str,
    step_summary: str | None,
    against: Mapping[str, object] | None = None,
    planned: int = 0,
) -> tuple[list[MeasurementResult], Outputs]:
    """Write what the session asked for; ``step_summary``: ``$GITHUB_STEP_SUMMARY``'s file;
    ``against``: what ``--llmperf-against``'s REF and both sides were (``Session.against_sides``).
    ``planned``: the llmperf tests the session meant to measure (none measured: the Markdown
    says every one failed). Returns the results with the session-wide Holm p-values, and what
    was written."""
    from ..judge.regression import session_holm
    from ..reports import session_file

    out = Outputs()
    out.other_hardware_line, out.other_hardware_fails = other_hardware_line(s, results)
    results = session_holm(results)  # the "p (Holm)" shown: over every comparison of the session
    if s.update_baselines and results:
        out.written = session_file.write_baselines(s.baseline_dir, results, out.baseline_errors)
    trends: Mapping[str, object] = {}  # each test's recent trend from the history, for the HTML report
    if s.history is not None and results and not s.disable:
        out.history_line, trends = keep(s.history, results, started_at, s.rootdir, s.compare, trends=bool(s.html))
    if s.json:
        text = session_file.session_json(results, started_at, ab=list(ab_results), against=against)
        write_file(Path(s.json), text, out.report_errors)
    md_extra = write_html(Path(s.html), s, results, started_at, trends, against, ab_results, out) if s.html else []
    write_markdown(s, results, list(ab_results), md_extra, against, planned, step_summary, out)
    return results, out


def write_html(
    path: Path,
    s: SessionSettings,
    results: Sequence[MeasurementResult],
    started_at: str,
    trends: Mapping[str, Any],
    against: Mapping[str, object] | None,
    ab_results: Sequence[Mapping[str, object]],
    out: Outputs,
) -> list[str]:
    """The HTML report at ``path`` (``out`` says where, or why not); the Markdown's lines about it."""
    from ..reports import html

    try:
        out.html_written = html.write_html(path, results, started_at, trends, against, ab=ab_results)
        return html.markdown_lines(path, Path(s.markdown) if s.markdown else None, results)
    except OSError as exc:
        out.html_error = f"llmperf: cannot write {s.html}: {exc.strerror or exc}"
    except LLMPerfError as exc:
        out.html_error = f"llmperf: HTML report not written: {exc}"
    return []


def write_markdown(
    s: SessionSettings,
    results: Sequence[MeasurementResult],
    ab: list[Mapping[str, object]],
    md_extra: list[str],
    against: Mapping[str, object] | None,
    planned: int,
    step_summary: str | None,
    out: Outputs,
) -> None:
    """The Markdown summary (``--llmperf-markdown``) and GitHub's step summary (the same, with a
    line about the HTML report in place of ``md_extra``)."""
    from ..reports import session_file

    measured = bool(results or ab)
    md = (
        session_file.markdown(results, md_extra, budgets_gate=s.budgets_gate, against=against, ab=ab)
        if measured
        else all_failed_markdown(planned)
    )
    if s.markdown and md:
        write_file(Path(s.markdown), md, out.report_errors)
    if step_summary and md:
        step_extra = [f"Plots: HTML report `{s.html}` (keep it as a CI artifact)."] if out.html_written else []
        if measured:  # the same, with a line about the HTML report in place of ``md_extra``
            md = session_file.markdown(results, step_extra, budgets_gate=s.budgets_gate, against=against, ab=ab)
        append_step_summary(step_summary, md, out.write_errors)


def append_step_summary(path: str, text: str, errors: list[str]) -> None:
    """``text`` appended to GitHub's step summary file (a line in ``errors`` when it cannot be)."""
    try:
        # O_NONBLOCK: a FIFO nobody reads fails at once (ENXIO) instead of waiting for a reader.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        os.set_blocking(fd, True)
        with open(fd, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        errors.append(f"llmperf: cannot write {path}: {exc.strerror or exc}")


def all_failed_markdown(planned: int) -> str:
    """The Markdown summary of a session none of whose measurements gave a result ("" when it
    planned none)."""
    if not planned:
        return ""
    return (
        "## llmperf\n\n"
        f"No results: every llmperf measurement of this session failed ({planned} planned, none measured); "
        "the test report says why.\n"
    )


Line = tuple[str, str]


def summary(
    s: SessionSettings,
    rows: Sequence[Mapping[str, object]],
    results: Sequence[MeasurementResult],
    out: Outputs | None,
    suite_failures: Sequence[str],
    *,
    verbosity: int,
    width: int,
    notes: Sequence[str] = (),
    ab: Sequence[Mapping[str, object]] = (),
) -> list[Line]:
    """Every line of the llmperf part of the terminal summary, for pytest's ``verbosity``
    (-q: a count, -qq: nothing but errors) and the terminal's ``width``; ``ab``: the session's
    A/B comparisons (session JSON ``ab`` entries: their parts join the "where it went" block).
    Every line is at most ``width`` characters: tables fit it, longer lines wrap with a
    hanging indent."""
    return [
        (kind, text if kind != "line" else _wrapped(text, width))
        for kind, text in _summary(
            s, rows, results, out, suite_failures, verbosity=verbosity, width=width, notes=notes, ab=ab
        )
    ]


def _wrapped(text: str, width: int) -> str:
    from ..reports.text import wrap_text

    return wrap_text(text, width) if any(len(line) > width for line in text.splitlines()) else text


def _summary(
    s: SessionSettings,
    rows: Sequence[Mapping[str, object]],
    results: Sequence[MeasurementResult],
    out: Outputs | None,
    suite_failures: Sequence[str],
    *,
    verbosity: int,
    width: int,
    notes: Sequence[str] = (),
    ab: Sequence[Mapping[str, object]] = (),
) -> list[Line]:
    lines: list[Line] = [("line", note) for note in notes]
    if out is not None:
        lines += outputs_lines(out, verbosity)
    lines += suite_lines(suite_failures)
    if verbosity <= -2:
        return lines
    if not rows:  # a session of A/Bs alone
        return lines + (where_lines(results, ab, width, verbosity) if verbosity >= 0 else [])
    if s.disable:
        return lines + [
            (
                "line",
                f"llmperf: {len(rows)} measurement(s) run once (--llmperf-disable): "
                "no budgets, statistics or baselines",
            )
        ]
    if verbosity == -1:
        return lines + quiet_lines(rows, results)
    lines += table_lines(s, rows, results, width)
    lines += comparison_lines(s, results, width, verbosity)
    lines += [("line", note) for note in verdict_notes(s, results)]
    lines += where_lines(results, ab, width, verbosity)
    return lines + (written_lines(out) if out is not None else [])


def suite_lines(suite_failures: Sequence[str]) -> list[Line]:
    """The measurements slower than the rest of the suite, under their alarm."""
    if not suite_failures:
        return []
    alarm: Line = ("alarm", "llmperf: slower than the rest of the suite (fails the session)")
    return [alarm] + [("line", line) for line in suite_failures]


def outputs_lines(out: Outputs, verbosity: int) -> list[Line]:
    """What the end of the session could not write (and what fails the session for it), the
    HTML report's place, the history's line and the other-hardware line."""
    lines = unwritten_lines(out)
    if out.history_line and (verbosity >= 0 or "not written" in out.history_line):
        lines.append(("line", out.history_line))
    if out.other_hardware_line:
        lines.append(("line", out.other_hardware_line))
    return lines


def unwritten_lines(out: Outputs) -> list[Line]:
    """Each file the end of the session could not write, and the HTML report's place."""
    lines: list[Line] = [("line", line) for line in out.baseline_errors]
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
    return lines + [("line", line) for line in out.write_errors]


def written_lines(out: Outputs) -> list[Line]:
    """The baseline files written, and the unreadable old files kept aside."""
    lines: list[Line] = []
    for path, moved in out.written:
        lines.append(("line", f"llmperf: baselines written to {path}"))
        if moved is not None:
            lines.append(("line", f"llmperf: the unreadable old file was kept as {moved}"))
    return lines


def quiet_lines(rows: Sequence[Mapping[str, object]], results: Sequence[MeasurementResult]) -> list[Line]:
    """-q: how many measurements, how many over budget, and the undecided budgets."""
    from ..judge.budgets import BudgetStatus
    from ..reports.session_file import against_of, undecided_lines

    over = sum(1 for r in rows if BudgetStatus.of_cell(str(r.get("budget", ""))) is BudgetStatus.FAIL)
    ref = f", judged against {against_of(results)}" if against_of(results) else ""
    line = f"llmperf: {len(rows)} measurement(s){ref}, {over} over budget (drop -q for the table)"
    return [("line", line)] + [("line", u) for u in undecided_lines(results, short=True)]


def table_lines(
    s: SessionSettings, rows: Sequence[Mapping[str, object]], results: Sequence[MeasurementResult], width: int
) -> list[Line]:
    """The summary table, what measuring cost, and the budgets left undecided."""
    from ..reports.text import overhead_lines, short_ids, summary_table

    lines: list[Line] = [("sep", "llmperf summary"), ("line", summary_table(rows, s.columns, width))]
    lines += [("line", line) for line in overhead_lines(rows)]
    names = short_ids([r.test for r in results])
    return lines + [("line", f"{names[r.test]}: budget undecided: {note}") for r in results for note in r.budget_notes]


def comparison_lines(
    s: SessionSettings, results: Sequence[MeasurementResult], width: int, verbosity: int
) -> list[Line]:
    """The comparison table (against the baselines, or against ``--llmperf-against``'s REF)
    and its notes: undecided budgets, and what each comparison can detect (-v: per metric)."""
    from ..reports.session_file import against_of, comparison_table, reach_lines, reach_summary, undecided_lines

    table = comparison_table(results, s.columns, width)
    if not table:
        return []
    against = against_of(results)
    lines: list[Line] = [
        ("sep", f"llmperf comparison against {against}" if against else "llmperf baseline comparison"),
        ("line", table),
    ]
    if against and " REF " not in table.splitlines()[0] + " ":
        lines.append(
            (
                "line",
                "llmperf: both sides' figures: a wider terminal or --llmperf-columns "
                "baseline,now,change,ci,verdict (the JSON, Markdown and HTML reports have them)",
            )
        )
    lines += [("line", line) for line in undecided_lines(results, short=True)]
    if verbosity >= 1:  # the "detects" column's figures, with where the noise estimate came from
        return lines + [("line", line) for line in reach_lines(results, short=True)]
    reach = reach_summary(results)
    return lines + ([("line", reach)] if reach else [])


def where_lines(
    results: Sequence[MeasurementResult], ab: Sequence[Mapping[str, object]], width: int, verbosity: int
) -> list[Line]:
    """The "where it went" block under the comparison table: per comparison whose phase moved
    (a few; -v: all), the parts that moved and those that did not (``reports.where``)."""
    from ..reports.where import explained, terminal_lines

    block = terminal_lines(explained(results, ab), width, verbose=verbosity >= 1)
    return [("sep", "llmperf where it went"), *(("line", line) for line in block)] if block else []


def verdict_notes(s: SessionSettings, results: Sequence[MeasurementResult]) -> list[str]:
    """Each verdict's note once, by short test id (none while recording baselines; an error's
    note is the test's failure already)."""
    from ..judge.verdict import BaselineStatus
    from ..reports.text import short_ids

    short = short_ids([r.test for r in results])
    return sorted(
        {
            f"{short[r.test]}: {r.verdict.note}"
            for r in results
            if r.verdict is not None
            and r.verdict.note
            and not s.update_baselines
            and r.verdict.status is not BaselineStatus.ERROR
        }
    )
