"""The end of a session, in the process that owns it (never an xdist worker): baselines
written when asked, the history appended, the JSON/HTML/Markdown reports and the CI step
summary. A file that cannot be written costs one line. A file the session was asked for (a
baseline under ``--llmperf-update-baselines``, the JSON, HTML or Markdown report) also fails
the session (``Outputs.failed``): CI must not pass with its evidence missing. A baseline's old
file is left as it was. The history and GitHub's step summary cost their line only.

The terminal summary at the end of a session, as lines: ``("line", text)``, or a separator
``("sep", title)`` / ``("alarm", title)`` (red) that the pytest layer draws."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.documents import write_new
from ..core.errors import LLMPerfError
from ..core.traces import trace_text
from ..core.workload import SentRequest, TraceRequest
from ..history import keep
from ..reports.reporters import MarkdownSummary, Reporter, SessionEnd, asked, report_names
from .options import SessionSettings

if TYPE_CHECKING:
    from ..history.series import Trend
    from ..judge.result import Outcome


@dataclass(frozen=True)
class Written:
    """One report the end of the session was asked for: where, and the one line why it was not
    written (None: it was)."""

    reporter: Reporter
    path: str
    error: str | None = None


@dataclass
class Outputs:
    """What the end of the session wrote, and the one line of each thing it could not write."""

    written: list[tuple[Path, Path | None]] = field(default_factory=list)  # baseline file, moved-aside copy
    write_errors: list[str] = field(default_factory=list)
    baseline_errors: list[str] = field(default_factory=list)
    reports: list[Written] = field(default_factory=list)  # in the order of their settings
    history_line: str | None = None
    #: Measurements not compared because their baselines are all from other hardware: the
    #: summary line, and whether it fails the session (``--llmperf-fail-other-hardware``).
    other_hardware_line: str | None = None
    other_hardware_fails: bool = False
    #: ``--llmperf-write-trace``: the line saying where the trace went (or why it was not
    #: written), and whether that fails the session (a file asked for, not written).
    trace_line: str | None = None
    trace_failed: bool = False

    @property
    def report_errors(self) -> list[str]:
        return [w.error for w in self.reports if w.error is not None]

    @property
    def failed(self) -> bool:
        """A file asked for was not written, or (when asked) a test was not compared: the
        session fails."""
        return bool(self.baseline_errors or self.report_errors or self.other_hardware_fails or self.trace_failed)


#: How many differing fingerprint fields the other-hardware line names before "...".
SHOWN_DIFFERENCES = 4


def other_hardware_line(s: SessionSettings, results: Sequence[Outcome]) -> tuple[str | None, bool]:
    """The one summary line for the measurements whose baselines were all recorded on other
    hardware (how many, and the fingerprint fields that differ), and whether it fails the
    session; (None, False) when there are none or the session records baselines."""
    if s.update_baselines or not s.compare:
        return None, False
    from ..judge.verdict import BaselineStatus

    other = [r.verdict for r in results if r.verdict is not None and r.verdict.status is BaselineStatus.OTHER_HARDWARE]
    if not other:
        return None, False
    fields = list(dict.fromkeys(d for v in other for d in v.changes))  # each once
    why = "; ".join(fields[:SHOWN_DIFFERENCES]) + ("; ..." if len(fields) > SHOWN_DIFFERENCES else "")
    line = (
        f"llmperf: {len(other)} of {len(results)} measurement(s) not compared: their baselines were recorded on "
        f"other hardware ({why or 'hardware keys differ'}); record them here with --llmperf-update-baselines, "
        "or run both sides in one session on a runner that changes CPU (docs/ab.md)"
        + ("; the session fails (--llmperf-fail-other-hardware)" if s.fail_other_hardware else "")
    )
    return line, s.fail_other_hardware


def finish(
    s: SessionSettings,
    results: Sequence[Outcome],
    ab_results: Sequence[Mapping[str, object]],
    started_at: str,
    step_summary: str | None,
    against: Mapping[str, object] | None = None,
    planned: int = 0,
) -> tuple[list[Outcome], Outputs]:
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
    reports = asked(s.reports)
    trends: Mapping[str, Sequence[Trend]] = {}  # each test's recent trend from the history
    if s.history is not None and results and not s.disable:
        wanted = any(r.needs_trends for r, _ in reports)
        out.history_line, trends = keep(s.history, results, started_at, s.rootdir, s.compare, trends=wanted)
    end = SessionEnd(results, ab_results, started_at, against, trends, s.budgets_gate, planned, s.reports)
    out.reports = write_reports(reports, end)
    if step_summary:  # the Markdown, with the reports' lines for a page that shows no local file
        lines = [line for w in out.reports if w.error is None for line in w.reporter.step_lines(w.path)]
        md = MarkdownSummary.text(end, lines)
        if md:
            append_step_summary(step_summary, md, out.write_errors)
    return results, out


def write_trace(path: str, sent: Sequence[SentRequest]) -> tuple[str, bool]:
    """``--llmperf-write-trace``: the session's served requests as a trace (arrival offsets from
    the first, in microseconds' precision) into the new file ``path``, never over one that
    exists; the summary's line, and whether the file asked for is missing (the session fails).
    No request sent: nothing written, and the line says so."""
    if not sent:
        return f"llmperf: no served request was sent: no trace written to {path}", False
    first = sent[0].sent_ns
    lines = [TraceRequest(round((r.sent_ns - first) / 1e9, 6), r.request) for r in sent]
    try:
        write_new(Path(path), trace_text(lines))
    except OSError as exc:
        return f"llmperf: cannot write the trace {path}: {exc.strerror or exc}", True
    return f"llmperf: trace of {len(lines)} served requests written to {path}", False


def write_reports(reports: Sequence[tuple[Reporter, str]], end: SessionEnd) -> list[Written]:
    """Each report in turn, the Markdown lines of those written passed on to the next; what
    came of each, in the order of their settings."""
    done: list[Written] = []
    for reporter, path in reports:
        try:
            lines = reporter.write(path, end)
        except OSError as exc:  # an announced report is named as given, the others as a path
            shown = path if reporter.announced else Path(path)
            done.append(Written(reporter, path, f"llmperf: cannot write {shown}: {exc.strerror or exc}"))
        except LLMPerfError as exc:
            done.append(Written(reporter, path, f"llmperf: {reporter.title} not written: {exc}"))
        else:
            done.append(Written(reporter, path))
            end = dataclasses.replace(end, links=[*end.links, *lines])
    order = report_names()
    return sorted(done, key=lambda w: order.index(w.reporter.setting.name))


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


Line = tuple[str, str]


def summary(
    s: SessionSettings,
    rows: Sequence[Mapping[str, object]],
    results: Sequence[Outcome],
    out: Outputs | None,
    suite_failures: Sequence[str],
    *,
    verbosity: int,
    width: int,
    notes: Sequence[str] = (),
    ab: Sequence[Mapping[str, object]] = (),
    over_budget: int | None = None,
) -> list[Line]:
    """Every line of the llmperf part of the terminal summary, for pytest's ``verbosity``
    (-q: a count, -qq: nothing but errors) and the terminal's ``width``; ``ab``: the session's
    A/B comparisons (session JSON ``ab`` entries: their parts join the "where it went" block);
    ``over_budget``: how many of the ``rows`` went over a budget (None: those of ``results``,
    when each row is one of theirs).
    Every line is at most ``width`` characters: tables fit it, longer lines wrap with a
    hanging indent."""

    def lines_of() -> list[Line]:
        lines: list[Line] = [("line", note) for note in notes]
        if out is not None:
            lines += outputs_lines(out, verbosity)
        lines += suite_lines(suite_failures)
        if verbosity <= -2:
            return lines
        if not rows:  # a session of A/Bs alone
            return lines + (where_lines(results, ab, width, verbosity) if verbosity >= 0 else [])
        if s.disable:
            once = f"llmperf: {len(rows)} measurement(s) run once (--llmperf-disable)"
            return lines + [("line", f"{once}: no budgets, statistics or baselines")]
        if verbosity == -1:
            return lines + quiet_lines(rows, results, over_budget)
        lines += table_lines(s, rows, results, width)
        lines += comparison_lines(s, results, width, verbosity)
        lines += [("line", note) for note in verdict_notes(s, results)]
        lines += where_lines(results, ab, width, verbosity)
        return lines + (written_lines(out) if out is not None else [])

    return [(kind, text if kind != "line" else _wrapped(text, width)) for kind, text in lines_of()]


def _wrapped(text: str, width: int) -> str:
    from ..reports.text import wrap_text

    return wrap_text(text, width) if any(len(line) > width for line in text.splitlines()) else text


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
    return lines + [("line", line) for line in (out.other_hardware_line, out.trace_line) if line]


def unwritten_lines(out: Outputs) -> list[Line]:
    """Each file the end of the session could not write, and the HTML report's place."""
    lines: list[Line] = [("line", line) for line in out.baseline_errors]
    if out.baseline_errors:
        lines.append(("line", f"llmperf: {len(out.baseline_errors)} baseline file(s) not written: the session fails"))
    for w in out.reports:
        if w.error is not None or w.reporter.announced:
            lines.append(("line", w.error or f"llmperf: {w.reporter.title} written to {Path(w.path)}"))
    if out.report_errors:
        lines.append(("line", f"llmperf: {len(out.report_errors)} report file(s) not written: the session fails"))
    return lines + [("line", line) for line in out.write_errors]


def written_lines(out: Outputs) -> list[Line]:
    """The baseline files written, and the unreadable old files kept aside."""
    lines: list[Line] = []
    for path, moved in out.written:
        lines.append(("line", f"llmperf: baselines written to {path}"))
        if moved is not None:
            lines.append(("line", f"llmperf: the unreadable old file was kept as {moved}"))
    return lines


def quiet_lines(
    rows: Sequence[Mapping[str, object]], results: Sequence[Outcome], over: int | None = None
) -> list[Line]:
    """-q: how many measurements, how many over budget (None: the results'), and the undecided budgets."""
    from ..reports.session_file import against_of, undecided_lines

    over = sum(r.over_budget for r in results) if over is None else over
    ref = f", judged against {against_of(results)}" if against_of(results) else ""
    line = f"llmperf: {len(rows)} measurement(s){ref}, {over} over budget (drop -q for the table)"
    return [("line", line)] + [("line", u) for u in undecided_lines(results, short=True)]


def table_lines(
    s: SessionSettings, rows: Sequence[Mapping[str, object]], results: Sequence[Outcome], width: int
) -> list[Line]:
    """The summary table, what measuring cost, and the budgets left undecided."""
    from ..reports.text import overhead_lines, short_ids, summary_table

    lines: list[Line] = [("sep", "llmperf summary"), ("line", summary_table(rows, s.columns, width))]
    lines += [("line", line) for line in overhead_lines(rows)]
    names = short_ids([r.test for r in results])
    return lines + [("line", f"{names[r.test]}: budget undecided: {note}") for r in results for note in r.budget_notes]


def comparison_lines(s: SessionSettings, results: Sequence[Outcome], width: int, verbosity: int) -> list[Line]:
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
        hidden = "llmperf: both sides' figures: a wider terminal or --llmperf-columns baseline,now,change,ci,verdict"
        lines.append(("line", hidden + " (the JSON, Markdown and HTML reports have them)"))
    lines += [("line", line) for line in undecided_lines(results, short=True)]
    if verbosity >= 1:  # the "detects" column's figures, with where the noise estimate came from
        return lines + [("line", line) for line in reach_lines(results, short=True)]
    reach = reach_summary(results)
    return lines + ([("line", reach)] if reach else [])


def where_lines(
    results: Sequence[Outcome], ab: Sequence[Mapping[str, object]], width: int, verbosity: int
) -> list[Line]:
    """The "where it went" block under the comparison table: per comparison whose phase moved
    (a few; -v: all), the parts that moved and those that did not (``reports.where``)."""
    from ..reports.where import explained, terminal_lines

    block = terminal_lines(explained(results, ab), width, verbose=verbosity >= 1)
    return [("sep", "llmperf where it went"), *(("line", line) for line in block)] if block else []


def verdict_notes(s: SessionSettings, results: Sequence[Outcome]) -> list[str]:
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
