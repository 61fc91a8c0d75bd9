"""``llmperf report SESSION.json -o PATH``: the HTML report (plots, tables, verdicts) of a
saved session report (``pytest --llmperf-json``), as ``--llmperf-html`` writes it."""

from __future__ import annotations

import argparse

HELP = "write the HTML report of a saved session report (pytest --llmperf-json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="the session report (JSON)")
    parser.add_argument("-o", "--output", default="llmperf-report.html", help="HTML file to write")
    parser.add_argument(
        "--jobs", type=int, default=None, help="processes drawing figures (default: usable CPUs, at most 8)"
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..baselines.store import atomic_write
    from ..reports.figures import require_matplotlib
    from ..reports.html import render_html
    from ..reports.session_file import read_session

    from ..core.errors import ConfigError

    require_matplotlib()
    data, results = read_session(args.session)  # read once
    created = data.get("created_at")
    try:
        against = data.get("against") if isinstance(data.get("against"), dict) else None
        page = render_html(results, created if isinstance(created, str) else None, workers=args.jobs, against=against)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ConfigError(
            f"{args.session} is not a usable session report ({type(exc).__name__}: {exc}); "
            "write the report again with pytest --llmperf-json"
        ) from None
    try:
        atomic_write(Path(args.output), page)
    except OSError as exc:
        raise ConfigError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(f"{args.output}: {len(results)} measurement(s)")
    return 0
