"""The reports the end of a session writes: one ``Reporter`` per format, and their registry.

A format is a ``Reporter``: its setting (``core.settings.report_file``, one line in ``SETTINGS``:
the pytest option, ini key, help and docs row come from it), what the summary calls it, what
it needs from the end of the session (``SessionEnd``) and ``write``. ``session/finish.py``
writes ``REPORTERS`` in turn; the settings check each one's path before the session runs. A
reporter from outside the package joins them, its setting ``SETTINGS``, by ``register``. Light
(read at every pytest start): each format's module is imported by its ``write``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.documents import write_output
from ..core.errors import ConfigError
from ..core.settings import SETTINGS, Setting

if TYPE_CHECKING:
    from ..history.series import Trend
    from ..judge.result import Outcome


@dataclass(frozen=True)
class SessionEnd:
    """What the end of a session gives its reports: the results (session-wide Holm p-values in),
    the A/B comparisons (session JSON ``ab`` entries), trends (read when a reporter
    ``needs_trends``), each report's path by setting name, and ``links``: the Markdown lines of
    the reports written before."""

    results: Sequence[Outcome]
    ab: Sequence[Mapping[str, object]]
    started_at: str
    against: Mapping[str, object] | None
    trends: Mapping[str, Sequence[Trend]]
    budgets_gate: bool
    planned: int
    paths: Mapping[str, str]
    links: Sequence[str] = ()


class Reporter(ABC):
    """One report format; ``write`` raises ``OSError`` or ``LLMPerfError`` when it cannot:
    the summary says so in one line and the session fails."""

    setting: Setting  # its path given turns it on
    title: str  # "HTML report not written: ..."
    announced: bool = False  # the summary says where it went (the path as given)
    needs_trends: bool = False  # the history reads each test's recent trend back for it

    def ready(self) -> None:
        """Before the session runs: raise ``LLMPerfError`` naming what to install."""

    @abstractmethod
    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        """Write it to ``path`` (``core.documents.write_output``); the Markdown's lines about it."""

    def step_lines(self, path: str) -> Sequence[str]:
        """What GitHub's step summary (it shows no local file) says about it once written."""
        return ()


class JsonReport(Reporter):
    setting = SETTINGS["json"]
    title = "JSON report"

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        from .session_file import session_json

        write_output(Path(path), session_json(end.results, end.started_at, ab=list(end.ab), against=end.against))
        return ()


class HtmlReport(Reporter):
    setting = SETTINGS["html"]
    title = "HTML report"
    announced = needs_trends = True

    def ready(self) -> None:
        from .charts import require_matplotlib

        require_matplotlib()

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        from .html import markdown_lines, render_html

        write_output(
            Path(path), render_html(end.results, end.started_at, trends=end.trends, against=end.against, ab=end.ab)
        )
        markdown = end.paths.get(MarkdownSummary.setting.name)
        return markdown_lines(Path(path), Path(markdown) if markdown else None, end.results)

    def step_lines(self, path: str) -> Sequence[str]:
        from .html import markdown_lines

        return markdown_lines(path, None, ())


class MarkdownSummary(Reporter):
    setting = SETTINGS["markdown"]
    title = "Markdown summary"

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
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


MARKDOWN = MarkdownSummary()
#: In the order they are written: the Markdown last, it links those before it.
REPORTERS: list[Reporter] = [JsonReport(), HtmlReport(), MARKDOWN]


def register(reporter: Reporter) -> None:
    """A report format more: written at the end of every session that gives its setting (before
    the Markdown summary, which links it), which joins ``SETTINGS`` (read when the plugin adds
    its options)."""
    if SETTINGS.setdefault(reporter.setting.name, reporter.setting) is not reporter.setting:
        raise ConfigError(
            f"llmperf: a setting named {reporter.setting.name!r} exists already; name the report otherwise"
        )
    REPORTERS.insert(REPORTERS.index(MARKDOWN), reporter)


def report_names() -> list[str]:
    """The registered reports' settings, in the order of ``SETTINGS`` (pytest --help's)."""
    names = {r.setting.name for r in REPORTERS}
    return [name for name in SETTINGS if name in names]


def asked(paths: Mapping[str, str]) -> list[tuple[Reporter, str]]:
    """The reports given a path (``SessionSettings.reports``), each with it, in writing order."""
    return [(r, paths[r.setting.name]) for r in REPORTERS if r.setting.name in paths]
