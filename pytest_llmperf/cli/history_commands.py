"""The commands on the session history: its tables, plots and CSV; change points; calibration.

``llmperf history [TEST] [--metric ...]``: the stored series as tables (change points and
the subject changes that coincide marked), trend plots with ``--html``, and a CSV export
that Apache Otava reads (``--csv DIR``; docs/history.md).

``llmperf detect``: change-point detection (E-divisive means, permutation test) on every
stored series; prints each change point with its session, commit, coinciding subject change,
step size and significance; exits 1 when a regression change point lies within the last N
sessions of its series, so it can gate CI on its own.

``llmperf calibrate``: what the gate can do on this machine, from the A/A sessions in the
history (run the suite N times unchanged first): per test and judged metric the spreads, the
false alarms of the rule replayed and the minimum detectable effect (docs/verdicts.md)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.catalog import JUDGED, RUN_FIELDS
from ..core.documents import refused_output
from ..core.errors import ConfigError
from ..core.progress import task
from ..core.settings import history_text
from ..core.values import arg_type
from ..history.connection import for_cli
from .common import add_setting, alpha, check_writable, output_file, output_folder, positive_int, share, write_output

if TYPE_CHECKING:
    from ..core.catalog import Metric
    from ..history.series import Series
    from ..judge.verdict import Comparison

HISTORY_HELP = "show the session history of each test and metric (tables, --html plots, --csv for Otava)"
#: Shown unless --metric says otherwise: the judged metric of each phase and the decode tail.
DEFAULT_METRICS = JUDGED
#: ``history`` and ``detect`` read the last this many sessions of each series unless
#: ``--sessions`` says otherwise: the change-point search takes about 0.1 s per series there on
#: a 2-core VM, whatever the history's size (docs/history.md: the sizes supported).
WINDOW_SESSIONS = 200


def add_history_location(parser: argparse.ArgumentParser) -> None:
    """``--history`` and ``--hardware``: which history, and which machine's sessions in it."""
    parser.add_argument(
        "--history",
        default=None,
        type=arg_type(history_text),
        metavar="PATH|URL",
        help="the history: a SQLite file or postgresql:// URL (default $LLMPERF_HISTORY, else the nearest "
        ".llmperf/history.sqlite from here up)",
    )
    parser.add_argument("--hardware", default=None, metavar="KEY", help="only this hardware key")


def add_history_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``history`` and ``detect`` share."""
    parser.add_argument("test", nargs="?", default=None, help="only tests whose id contains this")
    parser.add_argument(
        "--metric",
        action="append",
        choices=RUN_FIELDS,
        default=None,
        metavar="METRIC",
        help=f"metric to read: {', '.join(RUN_FIELDS)} (repeat for more; default {', '.join(DEFAULT_METRICS)})",
    )
    add_history_location(parser)
    parser.add_argument(
        "--sessions",
        type=positive_int,
        default=WINDOW_SESSIONS,
        metavar="N",
        help=f"only the last N sessions of each series (default {WINDOW_SESSIONS}; more take longer: about 2 s "
        "per series at 1000, docs/history.md)",
    )


def add_history_arguments(parser: argparse.ArgumentParser) -> None:
    add_history_source_arguments(parser)
    parser.add_argument(
        "--html", default=None, type=output_file, metavar="OUT", help="also write trend plots to this HTML file"
    )
    parser.add_argument(
        "--csv",
        default=None,
        type=output_folder,
        metavar="DIR",
        help="also export one CSV per test and an otava.yaml to DIR (made when missing)",
    )


def read(args: argparse.Namespace) -> tuple[list, str]:
    """The series, each cut to its last ``--sessions``, and a line saying how many sessions
    were left out ("" when none were)."""
    series = _stored(args, args.metric or DEFAULT_METRICS)
    longest = max(len(s.points) for s in series)
    cut = sum(len(s.points) > args.sessions for s in series)
    series = [dataclasses.replace(s, points=s.points[-args.sessions :]) for s in series]
    note = (
        f"{cut} of {len(series)} series cut to their last {args.sessions} sessions (up to {longest} stored); "
        "--sessions N reads more"
        if cut
        else ""
    )
    return series, note


def _stored(args: argparse.Namespace, metrics: Sequence[str]) -> list[Series]:
    """The stored series of ``metrics`` that ``--history``, ``--hardware`` and TEST select (never
    none); the lines about the history read (unreadable rows left out) on stderr: the tables stay clean."""
    from ..history.series import read_series

    loc = for_cli(args.history)
    skipped: list[str] = []
    series = read_series(loc, test=args.test, metrics=metrics, hardware_key=args.hardware, skipped=skipped)
    for line in skipped:
        print(line, file=sys.stderr)
    if not series:
        what = f" for tests matching {args.test!r}" if args.test else ""
        raise ConfigError(f"no stored sessions{what} in {loc.display}")
    return series


def run_history(args: argparse.Namespace) -> int:
    from ..history import series as history

    if args.csv is not None:  # before the history is read: one line, nothing half written
        check_writable(args.csv, "--csv", folder=True)
    if args.html is not None:
        check_writable(args.html, "--html")
    series, note = read(args)
    with task("history") as progress:
        progress.step("series", 0, len(series))
        for i, s in enumerate(series):
            steps = history.steps(s)
            print(history.title(s))
            print(history.table(s, steps))
            for step in steps:
                print("  change point: " + step.line())
            print()
            progress.advance(i + 1)
    if args.csv:
        postgres = for_cli(args.history).kind == "postgresql"
        try:
            written = history.export_csv(series, Path(args.csv), postgres=postgres)
        except OSError as exc:
            raise ConfigError(refused_output(args.csv, exc, "--csv")) from None
        extra = " and otava-postgres.yaml" if postgres else ""
        print(
            f"{args.csv}: {len(written)} CSV file(s), otava.yaml{extra} "
            f"(OTAVA_CONFIG={Path(args.csv) / 'otava.yaml'} otava analyze TEST)"
        )
    if args.html:
        from ..reports.charts import require_matplotlib
        from ..reports.html import history_page

        require_matplotlib()
        kind = write_output(args.html, history_page(series))
        print(f"{args.html}: trend plots of {len(series)} series", file=sys.stderr if kind == "stdout" else sys.stdout)
    if note:
        print(note)
    return 0


DETECT_HELP = "find change points in the history; exit 1 on a regression in the latest sessions"


def add_detect_arguments(parser: argparse.ArgumentParser) -> None:
    from ..history.changepoints import ALPHA, MIN_SIZE, PERMUTATIONS

    add_history_source_arguments(parser)
    parser.add_argument(
        "--last",
        type=positive_int,
        default=5,
        metavar="N",
        help="exit 1 when a regression change point lies in the last N sessions of its series (default 5)",
    )
    parser.add_argument(
        "--alpha", type=alpha, default=ALPHA, help=f"significance level of each split (default {ALPHA})"
    )
    parser.add_argument(
        "--min-change",
        type=share,
        default=None,
        metavar="SHARE",
        help="ignore steps smaller than this when gating, e.g. 2%% (default: every significant step)",
    )
    parser.add_argument(
        "--min-size",
        type=positive_int,
        default=MIN_SIZE,
        metavar="N",
        help=f"fewest sessions on each side of a change point (default {MIN_SIZE})",
    )
    parser.add_argument(
        "--permutations",
        type=positive_int,
        default=PERMUTATIONS,
        help=f"permutations per test (default {PERMUTATIONS})",
    )


def run_detect(args: argparse.Namespace) -> int:
    from ..history.series import detect, recent_regressions

    if args.min_size < 2:
        raise ConfigError("--min-size must be >= 2")
    series, note = read(args)
    found = detect(series, alpha=args.alpha, permutations=args.permutations, min_size=args.min_size)
    for step in found:
        print(step.line())
    gate = recent_regressions(found, args.last, args.min_change or 0.0)
    sessions = max(len(s.points) for s in series)
    busy = sum(p.busy for s in series for p in s.points)
    print(
        f"{len(found)} change point(s) in {len(series)} series (up to {sessions} sessions each"
        + (f"; {busy} judged MACHINE_SLOWER left out: a busy machine" if busy else "")
        + f"); {len(gate)} regression(s) in the last {args.last} session(s)"
    )
    if note:
        print(note)
    return 1 if gate else 0


CALIBRATE_HELP = "per test: within- and between-session spread, replayed false alarms and detectable effects"


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("test", nargs="?", default=None, help="only tests whose id contains this")
    add_history_location(parser)
    parser.add_argument(
        "--sessions",
        type=positive_int,
        default=20,
        metavar="N",
        help="the last N sessions of each series since its subject last changed (default 20)",
    )
    for name in ("alpha", "threshold", "tail_threshold"):  # as the pytest options (core.settings)
        add_setting(parser, name)
    parser.add_argument(
        "--tests",
        type=positive_int,
        default=None,
        metavar="N",
        help="tests in the suite's session, for Holm's family (default: the tests found)",
    )


@dataclasses.dataclass(frozen=True)
class Calibration:
    """One series' figures (``calibrate``): a row of ``llmperf calibrate``'s table."""

    sessions: int
    runs: int
    cv: float
    between: float | None
    alarms: int
    replayed: int
    stored: float | None
    window: float | None
    ab: float | None


def calibrate(spec, levels: Sequence, *, threshold: float, alpha_: float, m: int) -> Calibration:
    """One series' figures (``levels``: oldest first, one subject)."""
    from ..judge.rule import compare_levels, decide
    from ..judge.verdict import WINDOW_MIN_SESSIONS, WINDOW_SESSIONS, Level, NoiseModel, detectable

    def judged(past: Sequence[Level], candidate: Level, window: Sequence[Level] = ()) -> Comparison:
        c = compare_levels(spec, past, candidate, threshold=threshold, alpha=alpha_, provisional=False, window=window)
        return decide([c], alpha=alpha_, m=m)[0]

    k = len(levels)
    n = int(statistics.median(lv.n for lv in levels))
    cv = float(statistics.median(lv.spread for lv in levels))
    se = float(statistics.median(lv.se for lv in levels))
    typical = Level(0.0, se, n, cv)
    window = list(levels[-WINDOW_SESSIONS:])
    between = NoiseModel().window(window)[0] if k >= 2 else None
    alarms = replayed = 0
    for i in range(WINDOW_MIN_SESSIONS, k):
        past = list(levels[max(0, i - WINDOW_SESSIONS) : i])
        alarms += judged(past[:1], levels[i], past).failed
        replayed += 1
    stored = judged([typical], typical).detectable
    mean = sum(lv.log_level for lv in window) / len(window)
    enough = len(window) >= WINDOW_MIN_SESSIONS
    in_window = judged(window[:1], Level(mean, se, n, cv), window).detectable if enough else None
    # Both sides in one session: no between-session term, the two sides' runs only.
    ab = detectable(math.sqrt(2.0) * se, 2.0 * n - 2.0, alpha=alpha_ / m, threshold=threshold)
    return Calibration(
        sessions=k,
        runs=n,
        cv=cv,
        between=between,
        alarms=alarms,
        replayed=replayed,
        stored=stored,
        window=in_window,
        ab=ab,
    )


#: ``llmperf calibrate``'s table: one row per series (``_calibration_row``).
CALIBRATION_HEADERS = (
    "test",
    "metric",
    "sessions",
    "runs",
    "within CV",
    "between sd",
    "false alarms (replayed)",
    "detects: file once",
    "history window",
    "one session (A/B)",
)


def _calibrated(args: argparse.Namespace, s: Series, spec: Metric, m: int) -> Calibration | None:
    """``calibrate`` over the series' last ``--sessions`` sessions since its subject last
    changed; None without any."""
    start = max((i for i in range(1, len(s.points)) if s.changes_at(i)), default=0)
    levels = [p.level() for p in s.points[start:]][-args.sessions :]
    if not levels:
        return None
    threshold = args.tail_threshold if spec.tail else args.threshold
    return calibrate(spec, levels, threshold=threshold, alpha_=args.alpha, m=m)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _calibration_row(s: Series, spec: Metric, f: Calibration) -> list[str]:
    """A series' row of ``CALIBRATION_HEADERS``."""
    return [
        s.name,
        f"{s.phase} {spec.label}",
        str(f.sessions),
        str(f.runs),
        _pct(f.cv),
        _pct(f.between),
        f"{f.alarms} of {f.replayed}",
        _pct(f.stored),
        _pct(f.window),
        _pct(f.ab),
    ]


def run_calibrate(args: argparse.Namespace) -> int:
    from ..judge.rule import JUDGED
    from ..reports.text import wrap_text, wrapped_table

    series = _stored(args, [s.name for s in JUDGED])
    tests = args.tests or len({(s.test, s.label, s.hardware_key) for s in series})
    m = tests * len(JUDGED)
    specs = {s.name: s for s in JUDGED}
    rows, alarms, replayed = [], 0, 0
    with task("calibrate") as progress:
        progress.step("series", 0, len(series))
        for i, s in enumerate(series):
            progress.advance(i)
            spec = specs[s.metric]
            f = _calibrated(args, s, spec, m)
            if f is None:
                continue
            alarms += f.alarms
            replayed += f.replayed
            rows.append(_calibration_row(s, spec, f))
    width = shutil.get_terminal_size().columns
    print(wrapped_table(CALIBRATION_HEADERS, rows, width))
    print(
        wrap_text(
            f"Holm's family: {tests} test(s) x {len(JUDGED)} = {m}, alpha {args.alpha:g}; the rule flagged "
            f"{alarms} of {replayed} replayed A/A comparison(s) (expected at most {args.alpha:g} per session); "
            "'detects': the smallest slowdown flagged with 80% power",
            width,
        )
    )
    return 0


#: name -> (help line, add its arguments, run it -> exit status): read by ``cli.main``.
COMMANDS = {
    "history": (HISTORY_HELP, add_history_arguments, run_history),
    "detect": (DETECT_HELP, add_detect_arguments, run_detect),
    "calibrate": (CALIBRATE_HELP, add_calibrate_arguments, run_calibrate),
}
