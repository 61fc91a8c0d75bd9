"""The reports a session writes at its end, one ``Reporter`` each, and their registry.

A report format is a ``Reporter``: its setting (``--llmperf-<name> FILE``, declared in
``core.settings.SETTINGS`` by ``report_file``: its option, ini key, environment variable,
help and docs row come from that one line), what the summary calls it, what it needs from the
end of the session (``SessionEnd``), and ``write``. ``REPORTERS`` is the registry that
``session/finish.py`` writes in order and the settings check before the session runs; a
reporter from outside the package joins it (and its setting joins ``SETTINGS``) by
``register``. Light: read at every pytest start; each format's module is imported by its
``write`` only (they import scipy and matplotlib)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from ..core.settings import SETTINGS, Setting

if TYPE_CHECKING:
    from ..judge.result import MeasurementResult


@dataclass(frozen=True)
class SessionEnd:
    """What the end of a session gives its reports: the results (with the session-wide Holm
    p-values), the A/B comparisons (session JSON ``ab`` entries), when it started, what
    ``--llmperf-against`` compared (``Session.against_sides``), each test's recent trend from
    the history (read only when a reporter ``needs_trends``), whether budgets gate, how many
    measurements were planned, every report's path as given (by its setting's name), and the
    Markdown lines of the reports written before (the HTML report's link)."""

    results: Sequence[MeasurementResult]
    ab: Sequence[Mapping[str, object]]
    started_at: str
    against: Mapping[str, object] | None
    trends: Mapping[str, Sequence[Mapping[str, object]]]
    budgets_gate: bool
    planned: int
    paths: Mapping[str, str]
    links: Sequence[str] = ()


class Reporter(ABC):
    """One report format. ``write`` raises ``OSError`` (or ``LLMPerfError``) when the report
    cannot be written: the summary names it in one line and the session fails."""

    #: Its setting (``core.settings.report_file``): the path given turns it on.
    setting: Setting
    #: What the summary calls it ("HTML report not written: ...").
    title: str
    #: The summary says where it was written (and names the path as it was given).
    announced: bool = False
    #: It shows each test's recent trend: the history reads it back.
    needs_trends: bool = False

    def ready(self) -> None:
        """Before the session runs: raise ``LLMPerfError`` naming what to install."""

    @abstractmethod
    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        """Write the report to ``path`` (``core.documents.write_output``); the lines the
        Markdown summary says about it."""

    def step_lines(self, path: str) -> Sequence[str]:
        """What GitHub's step summary (which shows no local file) says about it once written."""
        return ()


class SessionFile(Reporter):
    setting = SETTINGS["json"]
    title = "JSON report"

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        from ..core.documents import write_output
        from .session_file import session_json

        write_output(Path(path), session_json(end.results, end.started_at, ab=list(end.ab), against=end.against))
        return ()


class HtmlReport(Reporter):
    setting = SETTINGS["html"]
    title = "HTML report"
    announced = True
    needs_trends = True

    def ready(self) -> None:
        from .charts import require_matplotlib

        require_matplotlib()  # say what to install now, not after the whole session

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        from . import html

        html.write_html(Path(path), end.results, end.started_at, end.trends, end.against, ab=end.ab)
        markdown = end.paths.get(MarkdownSummary.setting.name)
        return html.markdown_lines(Path(path), Path(markdown) if markdown else None, end.results)

    def step_lines(self, path: str) -> Sequence[str]:
        return [f"Plots: HTML report `{path}` (keep it as a CI artifact)."]


class MarkdownSummary(Reporter):
    setting = SETTINGS["markdown"]
    title = "Markdown summary"

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        from ..core.documents import write_output

        text = self.text(end, end.links)
        if text:
            write_output(Path(path), text)
        return ()

    @staticmethod
    def text(end: SessionEnd, extra: Sequence[str]) -> str:
        """The summary, ``extra`` after its headline ("" for a session that planned nothing)."""
        from .session_file import all_failed_markdown, markdown

        if not (end.results or end.ab):
            return all_failed_markdown(end.planned)
        return markdown(end.results, extra, budgets_gate=end.budgets_gate, against=end.against, ab=list(end.ab))


#: The registry, in the order the end of a session writes them (the Markdown last: it links the
#: reports written before it).
REPORTERS: list[Reporter] = [SessionFile(), HtmlReport(), MarkdownSummary()]


def register(reporter: Reporter) -> None:
    """Add a report format: ``reporter`` is written at the end of every session that gives its
    setting, which joins ``SETTINGS`` (pytest's options, ini keys and environment read it when
    the plugin adds them) unless it is there already."""
    setting = SETTINGS.setdefault(reporter.setting.name, reporter.setting)
    if setting is not reporter.setting:
        raise ConfigError(f"llmperf: a setting named {setting.name!r} exists already; name the report otherwise")
    REPORTERS.append(reporter)


def report_names() -> list[str]:
    """The settings of the registered reports, in the order of ``SETTINGS`` (pytest --help's)."""
    names = {r.setting.name for r in REPORTERS}
    return [name for name in SETTINGS if name in names]


def asked(paths: Mapping[str, str]) -> list[tuple[Reporter, str]]:
    """The registered reports given a path (``SessionSettings.reports``), each with it, in the
    order they are written."""
    return [(r, paths[r.setting.name]) for r in REPORTERS if r.setting.name in paths]
