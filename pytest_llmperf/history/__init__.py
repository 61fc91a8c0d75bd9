"""Every session's results kept, per test, label, phase and metric; change points found in
the series (``llmperf history``, ``llmperf detect``, the HTML report's trends).

Modules: ``connection`` (where it lives), ``database`` (the store and what a session appends),
``series`` (the one reader), ``changepoints`` (E-divisive means).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .connection import Location

if TYPE_CHECKING:
    from ..judge.result import Outcome
    from .series import Trend


def append_session(
    loc: Location, results: Sequence[Mapping[str, object]], started_at: str, rootdir: Path | str, compared: bool
) -> int:
    """Append the session's measured results to the history (one transaction); returns the
    session's id. Raises ``database.HistoryError`` (one line)."""
    from . import database

    return database.append(loc, database.session_row(started_at, rootdir, compared), database.measurement_rows(results))


def keep(
    loc: Location,
    results: Sequence[Outcome],
    started_at: str,
    rootdir: Path | str,
    compared: bool,
    *,
    trends: bool = False,
) -> tuple[str, dict[str, list[Trend]]]:
    """The plugin's end-of-session step: append, then (``trends``) read each test's recent
    trend back for the HTML report. Returns the line to print and the trends (``{result.test:
    [trends.trend_data]}``, empty when not read); a history that cannot be written costs that
    line, never the session's outcome."""
    from .database import HistoryError

    try:
        session_id = append_session(loc, [r.to_json() for r in results], started_at, rootdir, compared)
    except HistoryError as exc:
        return f"llmperf: history not written: {exc}", {}
    except (KeyError, TypeError, ValueError) as exc:  # a result the history cannot hold: say so, end the session
        return f"llmperf: history not written: unusable result ({type(exc).__name__}: {exc}); nothing was appended", {}
    line = f"llmperf: history: session #{session_id} ({len(results)} measurement(s)) appended to {loc.display}"
    if not trends:
        return line, {}
    from .series import attach

    try:
        return line, attach(results, loc)
    except HistoryError as exc:
        return f"{line}; trends not read: {exc}", {}
