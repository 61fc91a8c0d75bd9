"""``llmperf calibrate``: what the gate can do on this machine, from the A/A sessions in the
history (run the suite N times unchanged first, e.g. ``for i in $(seq 10); do pytest; done``).

Per test and judged metric: the runner's within-session spread (the runs' CV) and
between-session sd, the false alarms of the current rule replayed over the stored sessions
(each judged, as the plugin would, against the window of the sessions before it), and the
minimum detectable effect (80% power, the session's Holm step) for a baseline file recorded
once, for the history window, and for both sides measured in one session (A/B). This is what
a team runs once on a new CI runner type (docs/verdicts.md)."""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Sequence

from .common import add_setting, positive_int

HELP = "per test: within- and between-session spread, replayed false alarms and detectable effects"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("test", nargs="?", default=None, help="only tests whose id contains this")
    parser.add_argument(
        "--history", default=None, metavar="PATH|URL",
        help="the history: a SQLite file or postgresql:// URL (default $LLMPERF_HISTORY, else the nearest "
        ".llmperf/history.sqlite from here up)",
    )
    parser.add_argument("--hardware", default=None, metavar="KEY", help="only this hardware key")
    parser.add_argument("--sessions", type=positive_int, default=20, metavar="N",
                        help="the last N sessions of each series since its subject last changed (default 20)")
    for name in ("alpha", "threshold", "tail_threshold"):  # as the pytest options (settings_table)
        add_setting(parser, name)
    parser.add_argument("--tests", type=positive_int, default=None, metavar="N",
                        help="tests in the suite's session, for Holm's family (default: the tests found)")


def _reach(spec, window, candidate, threshold: float, alpha_: float, m: int) -> float | None:
    from ..judge.rule import compare_levels, decide

    c = compare_levels(spec, window[:1], candidate, threshold=threshold, alpha=alpha_, provisional=False, window=window)
    return decide([c], alpha=alpha_, m=m)[0].detectable


def calibrate(spec, levels: Sequence, *, threshold: float, alpha_: float, m: int) -> dict[str, object]:
    """One series' figures (``levels``: oldest first, one subject)."""
    from ..judge.rule import compare_levels, decide
    from ..judge.verdict import Level
    from ..judge.verdict import WINDOW_MIN_SESSIONS, WINDOW_SESSIONS, NoiseModel, detectable

    k = len(levels)
    n = int(statistics.median(lv.n for lv in levels))
    cv = float(statistics.median(lv.spread for lv in levels))
    se = float(statistics.median(lv.se for lv in levels))
    typical = Level(0.0, se, n, cv)
    window = list(levels[-WINDOW_SESSIONS:])
    between = NoiseModel().window(window)[0] if k >= 2 else None
    alarms = replayed = 0
    for i in range(WINDOW_MIN_SESSIONS, k):
        past = list(levels[max(0, i - WINDOW_SESSIONS):i])
        c = compare_levels(spec, past[:1], levels[i], threshold=threshold, alpha=alpha_, provisional=False, window=past)
        alarms += decide([c], alpha=alpha_, m=m)[0].verdict.value == "REGRESSION"
        replayed += 1
    stored = decide([compare_levels(spec, [typical], typical, threshold=threshold, alpha=alpha_, provisional=False)],
                    alpha=alpha_, m=m)[0].detectable
    mean = sum(lv.log_level for lv in window) / len(window)
    in_window = (_reach(spec, window, Level(mean, se, n, cv), threshold, alpha_, m)
                 if len(window) >= WINDOW_MIN_SESSIONS else None)
    # Both sides in one session: no between-session term, the two sides' runs only.
    ab = detectable(math.sqrt(2.0) * se, 2.0 * n - 2.0, alpha=alpha_ / m, threshold=threshold)
    return {"sessions": k, "runs": n, "cv": cv, "between": between, "alarms": alarms, "replayed": replayed,
            "stored": stored, "window": in_window, "ab": ab}


def run(args: argparse.Namespace) -> int:
    from ..core.errors import ConfigError
    from ..core.formats import render_table
    from ..history.connection import for_cli
    from ..history.series import read_series
    from ..judge.rule import JUDGED

    loc = for_cli(args.history)
    series = read_series(loc, test=args.test, metrics=[s.name for s in JUDGED], hardware_key=args.hardware)
    if not series:
        what = f" for tests matching {args.test!r}" if args.test else ""
        raise ConfigError(f"no stored sessions{what} in {loc.display}")
    tests = args.tests or len({(s.test, s.label, s.hardware_key) for s in series})
    m = tests * len(JUDGED)
    specs = {s.name: s for s in JUDGED}
    rows, alarms, replayed = [], 0, 0
    pct = lambda v: "n/a" if v is None else f"{v:.1%}"  # noqa: E731
    for s in series:
        start = max((i for i in range(1, len(s.points)) if s.changes_at(i)), default=0)
        levels = [p.level() for p in s.points[start:]][-args.sessions:]
        spec = specs[s.metric]
        f = calibrate(spec, levels, threshold=args.tail_threshold if spec.tail else args.threshold,
                      alpha_=args.alpha, m=m) if levels else None
        if f is None:
            continue
        alarms += int(f["alarms"])  # type: ignore[call-overload]
        replayed += int(f["replayed"])  # type: ignore[call-overload]
        rows.append([s.name, f"{s.phase} {spec.label}", str(f["sessions"]), str(f["runs"]), pct(f["cv"]),
                     pct(f["between"]), f"{f['alarms']} of {f['replayed']}", pct(f["stored"]), pct(f["window"]),
                     pct(f["ab"])])
    print(render_table(("test", "metric", "sessions", "runs", "within CV", "between sd", "false alarms (replayed)",
                        "detects: file once", "history window", "one session (A/B)"), rows))
    print(f"Holm's family: {tests} test(s) x {len(JUDGED)} = {m}, alpha {args.alpha:g}; the rule flagged "
          f"{alarms} of {replayed} replayed A/A comparison(s) (expected at most {args.alpha:g} per session); "
          "'detects': the smallest slowdown flagged with 80% power")
    return 0
