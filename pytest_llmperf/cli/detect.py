"""``llmperf detect``: change-point detection (E-divisive means, permutation test) on every
stored series; prints each change point with its session, commit, coinciding subject change,
step size and significance; exits 1 when a regression change point lies within the last N
sessions of its series, so it can gate CI on its own."""

from __future__ import annotations

import argparse

from .common import alpha, positive_int, share
from .history import add_history_arguments

HELP = "find change points in the history; exit 1 on a regression in the latest sessions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..history.changepoints import ALPHA, MIN_SIZE, PERMUTATIONS

    add_history_arguments(parser)
    parser.add_argument(
        "--last", type=positive_int, default=5, metavar="N",
        help="exit 1 when a regression change point lies in the last N sessions of its series (default 5)",
    )
    parser.add_argument("--alpha", type=alpha, default=ALPHA, help=f"significance level of each split (default {ALPHA})")
    parser.add_argument(
        "--min-change", type=share, default=None, metavar="SHARE",
        help="ignore steps smaller than this when gating, e.g. 2%% (default: every significant step)",
    )
    parser.add_argument(
        "--min-size", type=positive_int, default=MIN_SIZE, metavar="N",
        help=f"fewest sessions on each side of a change point (default {MIN_SIZE})",
    )
    parser.add_argument(
        "--permutations", type=positive_int, default=PERMUTATIONS, help=f"permutations per test (default {PERMUTATIONS})"
    )


def run(args: argparse.Namespace) -> int:
    from ..core.errors import ConfigError
    from ..history.series import detect, recent_regressions
    from .history import read

    if args.min_size < 2:
        raise ConfigError("--min-size must be >= 2")
    series = read(args)
    found = detect(series, alpha=args.alpha, permutations=args.permutations, min_size=args.min_size)
    for step in found:
        print(step.line())
    gate = recent_regressions(found, args.last, args.min_change or 0.0)
    sessions = max(len(s.points) for s in series)
    print(
        f"{len(found)} change point(s) in {len(series)} series (up to {sessions} sessions each); "
        f"{len(gate)} regression(s) in the last {args.last} session(s)"
    )
    return 1 if gate else 0
