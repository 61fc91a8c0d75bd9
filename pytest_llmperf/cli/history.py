"""``llmperf history [TEST] [--metric ...]``: the stored series as tables (change points and
the subject changes that coincide marked), trend plots with ``--html``, and a CSV export
that Apache Otava reads (``--csv DIR``; docs/history.md)."""

from __future__ import annotations

import argparse

from ..core.catalog import JUDGED
from .common import positive_int

HELP = "show the session history of each test and metric (tables, --html plots, --csv for Otava)"
#: Shown unless --metric says otherwise: the judged metric of each phase and the decode tail.
DEFAULT_METRICS = JUDGED


def add_history_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``history`` and ``detect`` share."""
    from ..baselines.records import RUN_FIELDS

    parser.add_argument("test", nargs="?", default=None, help="only tests whose id contains this")
    parser.add_argument(
        "--metric", action="append", choices=RUN_FIELDS, default=None,
        help=f"metric to read (repeat for more; default {', '.join(DEFAULT_METRICS)})",
    )
    parser.add_argument(
        "--history", default=None, metavar="PATH|URL",
        help="the history: a SQLite file or postgresql:// URL (default $LLMPERF_HISTORY, else the nearest "
        ".llmperf/history.sqlite from here up)",
    )
    parser.add_argument("--hardware", default=None, metavar="KEY", help="only this hardware key")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_history_arguments(parser)
    parser.add_argument("--sessions", type=positive_int, default=None, metavar="N", help="only the last N sessions of each series")
    parser.add_argument("--html", default=None, metavar="OUT", help="also write trend plots to this HTML file")
    parser.add_argument("--csv", default=None, metavar="DIR", help="also export one CSV per test and an otava.yaml to DIR")


def read(args: argparse.Namespace, last: int | None = None) -> list:
    from ..core.errors import ConfigError
    from ..history.connection import for_cli
    from ..history.series import read_series

    loc = for_cli(args.history)
    series = read_series(loc, test=args.test, metrics=args.metric or DEFAULT_METRICS, hardware_key=args.hardware, last=last)
    if not series:
        what = f" for tests matching {args.test!r}" if args.test else ""
        raise ConfigError(f"no stored sessions{what} in {loc.display}")
    return series


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..history import series as history

    series = read(args, args.sessions)
    for s in series:
        steps = history.steps(s)
        print(history.title(s))
        print(history.table(s, steps))
        for step in steps:
            print("  change point: " + step.line())
        print()
    if args.csv:
        from ..history.connection import for_cli

        postgres = for_cli(args.history).kind == "postgresql"
        written = history.export_csv(series, Path(args.csv), postgres=postgres)
        extra = " and otava-postgres.yaml" if postgres else ""
        print(f"{args.csv}: {len(written)} CSV file(s), otava.yaml{extra} "
              f"(OTAVA_CONFIG={Path(args.csv) / 'otava.yaml'} otava analyze TEST)")
    if args.html:
        from ..baselines.store import atomic_write
        from ..core.errors import ConfigError
        from ..reports.figures import require_matplotlib
        from ..reports.html import history_page

        require_matplotlib()
        try:
            atomic_write(Path(args.html), history_page(series))
        except OSError as exc:
            raise ConfigError(f"cannot write {args.html}: {exc.strerror or exc}") from None
        print(f"{args.html}: trend plots of {len(series)} series")
    return 0
