"""The commands on saved session reports (pytest --llmperf-json): compare two, write one's HTML
report.

``llmperf compare BASE.json NEW.json``: the plugin's statistics between two saved session
reports; exit 1 on any regression, 2 on unusable input or when no
test is in both reports (a CI gate must not pass on nothing compared).

``llmperf report SESSION.json -o PATH``: the HTML report of a saved session report, as
``--llmperf-html`` writes it."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError, did_you_mean
from ..core.fingerprint import other_hardware_note
from ..core.settings import COMPARISON_COLUMN_NAMES, DEFAULT_COMPARISON_COLUMNS
from .common import add_setting, output_file, positive_int, session_report, write_output

if TYPE_CHECKING:
    from ..judge.regression import CompareSettings
    from ..judge.result import BaselineVerdict, Outcome

COMPARE_HELP = "compare two saved session reports (pytest --llmperf-json)"


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", type=session_report, help="the baseline session report")
    parser.add_argument("new", type=session_report, help="the candidate session report")
    for name in ("alpha", "threshold", "tail_threshold"):  # as the pytest options (core.settings)
        add_setting(parser, name)
    parser.add_argument(  # --llmperf-columns' comparison half, plus 'all'
        "--columns",
        type=_columns,
        default=None,
        metavar="COLS",
        help=f"table columns after test and metric, from {', '.join(COMPARISON_COLUMN_NAMES)}, or 'all' "
        f"(default {','.join(DEFAULT_COMPARISON_COLUMNS)}: fits the terminal)",
    )
    parser.add_argument(
        "--any-hardware", action="store_true", help="compare even when the reports come from different hardware"
    )


def _columns(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in COMPARISON_COLUMN_NAMES + ("all",)]
    if unknown or not names:
        hint = did_you_mean(unknown[0], (*COMPARISON_COLUMN_NAMES, "all")) if unknown else ""
        raise argparse.ArgumentTypeError(
            f"unknown column(s) {', '.join(unknown) or '(none given)'}{hint}; choose from "
            f"{', '.join(COMPARISON_COLUMN_NAMES)} or all"
        )
    return names


def run_compare(args: argparse.Namespace) -> int:
    from ..reports.session_file import load_session

    base = {r.test: r for r in load_session(args.base)}
    new = load_session(args.new)
    matched = [r for r in new if r.test in base]
    if not matched:
        raise ConfigError(f"no test in both {args.base} and {args.new}: nothing to compare")
    try:
        return _compare(args, base, new, matched)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ConfigError(
            f"{args.base} or {args.new} is not a usable session report ({type(exc).__name__}: {exc}); "
            "write the report again with pytest --llmperf-json"
        ) from None


def _compare(args: argparse.Namespace, base: dict, new: list, matched: list) -> int:
    from ..judge.regression import CompareSettings
    from ..judge.rule import JUDGED

    settings = CompareSettings(
        alpha=args.alpha,
        threshold=args.threshold,
        tail_threshold=args.tail_threshold,
        family_size=max(len(matched), 1) * len(JUDGED),
    )
    results, notes, failures = [], [], []
    regressed = 0
    for r in new:
        old = base.get(r.test)
        skipped = _not_compared(args, r, old)
        if skipped:
            notes.append(skipped)
            continue
        verdict = _judged(args, r, old, settings)
        if verdict.note:
            notes.append(f"{r.test}: {verdict.note}")
        results.append(dataclasses.replace(r, verdict=verdict))
        lines = verdict.failures
        regressed += bool(lines)
        failures += [f"{r.test}: {line}" for line in lines]
    notes += [f"{test}: not in {args.new}" for test in sorted(set(base) - {r.test for r in new})]
    return _print_comparison(args, results, notes, failures, regressed)


def _not_compared(args: argparse.Namespace, r: Outcome, old: Outcome | None) -> str | None:
    """Why the new result ``r`` is not compared with the base's ``old``, or None when it is."""
    if old is None:
        return f"{r.test}: not in {args.base}"
    if r.record is None or old.record is None:  # judged against --llmperf-against's REF: nothing recorded
        where = args.new if r.record is None else args.base
        return f"{r.test}: no record in {where} (a session run with --llmperf-against): not compared"
    return None


def _judged(args: argparse.Namespace, r: Outcome, old: Outcome | None, settings: CompareSettings) -> BaselineVerdict:
    """The new result's record judged against the base's (its hardware's, or any with
    ``--any-hardware``); other hardware named field by field."""
    from ..judge.regression import judge
    from ..judge.verdict import BaselineStatus

    assert old is not None and r.record is not None and old.record is not None  # else _not_compared says why
    hw_key = r.hardware_key if args.any_hardware else old.hardware_key
    verdict = judge({hw_key: old.record}, r.hardware_key, r.record, settings)
    if verdict.status == BaselineStatus.OTHER_HARDWARE:  # name the fields that differ
        note = other_hardware_note(
            {hw_key: old.record.hardware}, r.hardware_key, r.record.hardware, hint="compare anyway with --any-hardware"
        )
        verdict = dataclasses.replace(verdict, note=note)
    return verdict


def _print_comparison(
    args: argparse.Namespace, results: list[Outcome], notes: list[str], failures: list[str], regressed: int
) -> int:
    """The comparison table, the notes, the undecided and failed comparisons, the count; 1 when
    something regressed."""
    from ..reports.session_file import comparison_table, undecided_lines
    from ..reports.text import wrap_text
    from ..reports.where import explained, terminal_lines

    width = None if args.columns == ["all"] else shutil.get_terminal_size().columns
    table = comparison_table(results, args.columns, width)
    print(table if table else "nothing to compare")
    where = terminal_lines(explained(results), width or shutil.get_terminal_size().columns, verbose=True)
    for line in ["where it went:", *where] if where else []:
        print(line)
    for line in notes + undecided_lines(results, short=width is not None) + failures:
        print(line if width is None else wrap_text(line, width))
    print(f"{regressed} regression(s) in {len(results)} compared measurement(s)")
    return 1 if failures else 0


REPORT_HELP = "write the HTML report of a saved session report (pytest --llmperf-json)"


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", type=session_report, help="the session report (JSON)")
    parser.add_argument(
        "-o",
        "--output",
        default="llmperf-report.html",
        type=output_file,
        help="HTML file to write (- : standard output)",
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="processes drawing figures, at most the usable CPUs (default: usable CPUs, at most 8)",
    )


def run_report(args: argparse.Namespace) -> int:
    from ..reports.charts import require_matplotlib
    from ..reports.html import render_html
    from ..reports.session_file import read_session

    require_matplotlib()
    data, results = read_session(args.session)  # read once
    created = data.get("created_at")
    try:
        against = data.get("against") if isinstance(data.get("against"), dict) else None
        given = data.get("ab")
        ab: list[Any] = given if isinstance(given, list) else []
        page = render_html(
            results, created if isinstance(created, str) else None, workers=args.jobs, against=against, ab=ab
        )
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ConfigError(
            f"{args.session} is not a usable session report ({type(exc).__name__}: {exc}); "
            "write the report again with pytest --llmperf-json"
        ) from None
    kind = write_output(args.output, page)
    # With the page on standard output, the count goes to stderr, out of the page's way.
    print(f"{args.output}: {len(results)} measurement(s)", file=sys.stderr if kind == "stdout" else sys.stdout)
    return 0


#: name -> (help line, add its arguments, run it -> exit status): read by ``cli.main``.
COMMANDS = {
    "compare": (COMPARE_HELP, add_compare_arguments, run_compare),
    "report": (REPORT_HELP, add_report_arguments, run_report),
}
