"""pytest hooks, calling the pytest-free ``session.Session`` (engines, assessments, reports,
files); the marker's handling in ``marks``, the fixtures in ``fixtures``. A budget breach fails
*that* test (as pytest-memray does), through ``pytest_runtest_makereport``. Loaded by every
pytest run: numpy, scipy, llama_cpp, asyncio, the measuring modules and the reports are
imported only once an llmperf test is collected (tests/test_plugin_cli.py checks).

The plugin's command-line options and ini keys, built from ``core.settings.SETTINGS``
(the one declaration of every setting: parser, default, help, env, ini)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from ..core.errors import ConfigError, LLMPerfError, closest_name, did_you_mean
from ..core.progress import Sink, fit, set_sink
from ..core.settings import RENAMED_SETTINGS, SETTINGS, conflicting_option
from ..reports.reporters import asked
from ..session import Session, SessionSettings
from ..session.options import marker_help
from ..session.sides import SIDE_ENV
from . import hooks as hookcalls
from . import hooks as hookspecs
from . import marks
from .fixtures import FIXTURE, llmperf, llmperf_engine, llmperf_llama_server, llmperf_llm, llmperf_server  # noqa: F401 (pytest finds fixtures here)
from .marks import MARKER_CONFIG, PLUGIN_NAME, PROJECT, PROPERTIES, SESSION, make_scheduler
from .project import locate as locate_project
from .side import AgainstHooks, SidePlugin, side_settings

if TYPE_CHECKING:
    from ..reports.session_file import CallReport
    from .fixtures import LLMPerf


def pytest_addoption(parser: pytest.Parser) -> None:
    """Every ``--llmperf-*`` option and ``llmperf_*`` ini key. A value left out is None here:
    ``settings.resolve`` then looks at the environment, the ini file and the default."""
    group = parser.getgroup("llmperf", "LLM inference performance (pytest-llmperf)")
    for s in SETTINGS.values():
        # argparse %-formats help strings: a literal ``%`` must be written ``%%``.
        kind = {"action": "store_true"} if s.switch else {"default": None, "type": s.arg_type(), "metavar": s.metavar}
        group.addoption(s.option, dest=s.dest, help=s.help_text().replace("%", "%%"), **kind)
        if s.ini_key is not None:
            parser.addini(s.ini_key, f"{s.help} (default {s.default_text()})")
    # The old spellings (settings.RENAMED), hidden: taken, then refused by settings.resolve in one line.
    for old, new in RENAMED_SETTINGS:
        group.addoption(old.option, dest=old.dest, default=None, help=argparse.SUPPRESS)
        if old.ini_key is not None:
            parser.addini(old.ini_key, f"renamed to {new.ini_key}")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", marker_help())
    _warn_unknown_ini_keys(config)
    is_worker = hasattr(config, "workerinput")
    _group_on_xdist(config, is_worker)
    side = _side_plugin(config)
    settings = _settings(config, side is not None, is_worker)
    config.stash[SESSION] = Session(
        settings,
        fingerprint_hook=lambda hw, subject, info: hookcalls.fingerprint(config, hw, subject, info),
        make_engine_hook=lambda s, engine_config: hookcalls.make_engine(config, s, engine_config),
        is_worker=is_worker,
    )
    config.stash[SESSION].side = None if side is None else side.link
    if side is not None:
        side.link.threads = settings.engine.threads  # what the session's engine (llmperf_llm) uses
    hooks = LLMPerfHooks(config, config.stash[SESSION])
    config.pluginmanager.register(hooks, PLUGIN_NAME)
    if side is None and not is_worker and config.get_verbosity() > -2:
        # Long waits say where they are on this terminal (-qq: silence; an xdist worker's or a
        # side's output is not the user's terminal, so they show nothing).
        hooks.sink = TerminalSink(config)
        hooks.sink_before = set_sink(hooks.sink)
    if settings.against:
        hooks.against = AgainstHooks(config, config.stash[SESSION])
        config.pluginmanager.register(hooks.against, PLUGIN_NAME + "-against")


def _warn_unknown_ini_keys(config: pytest.Config) -> None:
    """An ``llmperf_*`` ini key that is none of the plugin's (a typo would be ignored in
    silence, and its setting with it): one warning with the closest keys."""
    known = [s.ini_key for s in SETTINGS.values() if s.ini_key is not None]
    old = [old.ini_key for old, _ in RENAMED_SETTINGS if old.ini_key is not None]  # settings.resolve's line
    unknown = getattr(config, "_get_unknown_ini_keys", None)  # pytest's own list (it warns without a hint)
    for key in sorted(unknown() if callable(unknown) else ()):
        if not key.startswith("llmperf") or key in known or key in old:
            continue
        same = SETTINGS.get(closest_name(key.removeprefix("llmperf_"), SETTINGS) or "")
        if same is not None and same.ini_key is None:
            hint = f"; {same.name} has no ini key: use {same.option}"
        else:
            hint = did_you_mean(key, known, "llmperf_") or " (the ini keys: docs/settings.md)"
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(f"llmperf: unknown llmperf ini key {key!r}{hint}"), stacklevel=2
        )


def _group_on_xdist(config: pytest.Config, is_worker: bool) -> None:
    """pytest-xdist: perf tests side by side measure each other. Its default "load" becomes
    "loadgroup", which keeps the llmperf tests (marked xdist_group("llmperf") at collection)
    on one worker and spreads the others as before."""
    if not is_worker and getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
    if getattr(config, "workerinput", {}).get("llmperf_dist") == "loadgroup":
        config.option.loadgroup = True  # a worker re-parses the command line: it cannot tell


def _settings(config: pytest.Config, on_side: bool, is_worker: bool) -> SessionSettings:
    """The session's settings, read once (a bad one: pytest's usage error, one line), the
    project-relative ones (baselines, history) against the project's folder (``project``)."""
    project = config.stash[PROJECT] = locate_project(config)
    try:
        conflict = conflicting_option(config.invocation_params.args)
        if conflict is not None:
            project = config.stash[PROJECT] = dataclasses.replace(
                project, notes=(*project.notes, f"llmperf: warning: {conflict}")
            )
        settings = SessionSettings.from_options(config.getoption, project.getini(config), project.rootdir)
        if on_side:
            settings = side_settings(settings)
        if settings.write_trace and (is_worker or getattr(config.option, "numprocesses", None)):
            raise ConfigError(
                "llmperf: --llmperf-write-trace writes the requests of one process: run the session without "
                "pytest-xdist's -n (its workers' requests would be left out)"
            )
        if not is_worker:
            for reporter, _ in asked(settings.reports):
                reporter.ready()  # say what to install now, not after the whole session
    except LLMPerfError as exc:
        raise pytest.UsageError(str(exc)) from None
    return settings


def _side_plugin(config: pytest.Config) -> SidePlugin | None:
    """This process's ``side.SidePlugin`` when it is a side of ``--llmperf-against``, else None."""
    if SIDE_ENV not in os.environ:
        return None
    return next((p for p in config.pluginmanager.get_plugins() if isinstance(p, SidePlugin)), None)


class LLMPerfHooks:
    """The session's hooks, registered at configure time (one per pytest run)."""

    def __init__(self, config: pytest.Config, session: Session) -> None:
        self.config = config
        self.session = session
        self.groups_dir: str | None = None  # xdist controller: workers' group files
        #: A test's results from its call report, kept until its teardown report says this
        #: attempt is the last (pytest-rerunfailures logs an attempt to be run again as "rerun").
        self.pending: dict[str, tuple[list[Any], list[Any]]] = {}
        self.against: AgainstHooks | None = None  # against.AgainstHooks under --llmperf-against
        self.sink: TerminalSink | None = None  # core.progress's lines on this terminal (none: silent)
        self.sink_before: Sink | None = None  # the sink it replaced, put back at the end

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        project = config.stash[PROJECT]
        notes = [*([project.moved] if project.moved else []), *project.notes]
        return _fitted([*notes, *marks.header(config, self.session, hookcalls.engine_note(config))], config)

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        """The model line, once collection found llmperf tests to run (none: not a word)."""
        if self.session.is_worker or self.session.settings.skip or not any(marks.is_perf(i) for i in items):
            return []
        lines = _fitted(self.session.describe(hookcalls.engine_note(config)), config)
        verbosity = config.get_verbosity()
        if verbosity < 0:  # -q: only the warnings; -qq: nothing
            return [line for line in lines if "warning" in line] if verbosity == -1 else []
        return lines

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: _WorkerNode) -> None:
        """Controller: tell each worker the distribution mode and where to write its groups."""
        dist = getattr(self.config.option, "dist", "no")
        node.workerinput["llmperf_dist"] = dist
        if dist == "loadgroup":
            if self.groups_dir is None:
                self.groups_dir = tempfile.mkdtemp(prefix="llmperf-xdist-")
            node.workerinput["llmperf_groups_dir"] = self.groups_dir

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object:
        if getattr(config.option, "dist", "no") == "loadgroup" and self.groups_dir is not None:
            return make_scheduler(config, log, self.groups_dir)
        return None

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        if report.passed:
            marks.stash_markers(report)
        return report

    @pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        s = self.session.settings
        marks.group_on_worker(self.config, items, marks.select(self.config, items, s.skip, s.only))

    @pytest.hookimpl(tryfirst=True)  # before the terminal's, which asks for the header lines
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After deselection (-k, -m): Holm's family is what will be measured.
        self.session.plan(*marks.planned(session.items))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        result = yield  # raises if the test body failed: then nothing is measured
        fixture = item.stash.get(FIXTURE, None)
        if fixture is not None and not fixture.results and not fixture.ab_results and MARKER_CONFIG in item.stash:
            if item.stash[MARKER_CONFIG].is_ab:
                fixture.compare()  # the marker's a=..., b=...: an interleaved A/B
            else:
                fixture.measure()
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, Any]:
        fixture = item.stash.get(FIXTURE, None)
        if fixture is None or call.when != "call" or not (fixture.results or fixture.ab_results):
            return (yield)
        parts = self._call_report(item, fixture)
        report = yield
        report.sections.extend(parts.sections)
        if parts.results:
            report.llmperf = parts.results  # judge.result's objects; JSON only on xdist's wire (below)
        if parts.ab:
            report.llmperf_ab = parts.ab
        if parts.lines and report.passed:
            from ..reports.text import wrap_text

            report.outcome = "failed"
            report.longrepr = "\n".join(wrap_text(line, marks.terminal_width(self.config)) for line in parts.lines)
        if fixture.ab_results:
            from ..judge.ab import attach

            attach(report, fixture.ab_results, verbose=self.config.get_verbosity() > 0)
        return report

    def _call_report(self, item: pytest.Item, fixture: LLMPerf) -> CallReport:
        """The test's report parts, each result through ``pytest_llmperf_result`` first; its JUnit
        properties on the item, so they reach every later report (JUnit reads the teardown one),
        an earlier attempt's (pytest-rerunfailures) replaced, not added to."""
        results, hook_error = fixture.results, None
        try:
            results = [hookcalls.result(self.config, item, r) for r in results]
        except LLMPerfError as exc:
            hook_error = str(exc)
        test = marks.full_id(item, self.config.rootpath)
        parts = self.session.call_report(
            test, results, fixture.ab_results, marks.terminal_width(self.config), hook_error
        )
        for prop in item.stash.get(PROPERTIES, []):
            if prop in item.user_properties:
                item.user_properties.remove(prop)
        item.user_properties.extend(parts.properties)
        item.stash[PROPERTIES] = list(parts.properties)
        return parts

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(self, config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
        """A report leaving this process (an xdist worker's): its results as their JSON."""
        data = yield
        if isinstance(data, dict) and data.get("llmperf"):
            data["llmperf"] = [r.to_json() for r in data["llmperf"]]
        return data

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(
        self, config: pytest.Config, data: dict[str, object]
    ) -> Generator[None, Any, Any]:
        """A worker's report arriving: its results rebuilt once, here (written by ``to_json``
        of this same package: not re-validated, so the controller's work stays small while a
        worker may be measuring on the next core)."""
        report = yield
        shipped = getattr(report, "llmperf", None)
        if shipped:
            from ..judge.result import Outcome

            report.llmperf = [Outcome.from_json(d, check=False) for d in shipped]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Only a test's last attempt is recorded: its call report's results wait for its
        teardown report; a "rerun" report (pytest-rerunfailures) drops them. Runs on the xdist
        controller too: the results come from the serialized report."""
        if report.outcome == "rerun":
            self.pending.pop(report.nodeid, None)
        elif report.when == "call":
            shipped, ab = getattr(report, "llmperf", None), getattr(report, "llmperf_ab", None)
            if shipped or ab:
                self.pending[report.nodeid] = (list(shipped or []), list(ab or []))
        elif report.when == "teardown":
            self._collect(report.nodeid)

    def _collect(self, *nodeids: str) -> None:
        for nodeid in nodeids:
            shipped, ab = self.pending.pop(nodeid, ([], []))
            if shipped or ab:
                self.session.collect(shipped, ab)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.sink is not None:
            self.sink.nodeid = nodeid

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.session.engines.finished(nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        result = yield
        self._collect(*list(self.pending))  # a teardown never reported (interrupted): its call's results
        # Every result is in (with pytest-xdist, from every worker): the suite-relative check.
        if self.session.suite_check():
            session.testsfailed += 1
        return result

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._collect(*list(self.pending))
        try:
            outputs = self.session.finish(os.environ)
        except KeyboardInterrupt as exc:  # Ctrl-C while writing (pytest would print a traceback)
            line = str(exc) or "interrupted at the end of the session"
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            text = f"llmperf: {line}; the session's files not written yet were left out"
            if reporter is not None:
                reporter.write_line(text)
            else:
                print(text, file=sys.stderr)
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            return
        if outputs is not None and outputs.failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a file asked for was not written

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        width = marks.terminal_width(self.config)
        for kind, text in self.session.summary(terminalreporter.config.get_verbosity(), width):
            if kind == "line":
                terminalreporter.write_line(text)
            else:
                terminalreporter.write_sep("-", text, red=kind == "alarm")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.sink is not None:
            set_sink(self.sink_before)
        if self.against is not None:
            self.against.close()
        if self.groups_dir is not None:
            shutil.rmtree(self.groups_dir, ignore_errors=True)
        self.session.close()


class TerminalSink:
    """``core.progress``'s lines on pytest's terminal, written as pytest's live logging writes
    them: through its terminal reporter, with output capture set aside. On a line of their own:
    on a terminal one line redrawn in place, its last text kept; piped, plain lines. At a task's
    end pytest's own line starts again (the test file's name, where its result letters go)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.open = False  # a line of ours without its newline yet
        self.nodeid: str | None = None  # the test that runs (``pytest_runtest_logstart``)

    @property
    def reporter(self) -> pytest.TerminalReporter | None:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    @property
    def live(self) -> bool:
        return bool(getattr(self.reporter, "isatty", False))

    def _write(self, text: str, *, last: bool) -> None:
        reporter = self.reporter
        if reporter is None:
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            if not self.open:
                reporter.ensure_newline()  # pytest's "tests/t.py ." line ends; ours is a line of its own
                if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                    reporter.line("")  # -q: the result letters, with no file name before them
            elif not self.live:
                reporter.line("")
            if self.live:
                reporter.rewrite(fit(text, marks.terminal_width(self.config) - 1), erase=True)
            else:  # a log line: wrapped whole at the width, never cut (a long test id, a slow step)
                reporter.write(_fitted([text], self.config)[0])
            self.open = True
            if last:
                self._resume(reporter)
            reporter.flush()

    def _resume(self, reporter: pytest.TerminalReporter) -> None:
        """Our line ends and pytest's goes on: the test file's name again where pytest shows it
        before its result letters (else a newline: -v writes the test's name again itself)."""
        self.open = False
        if self.nodeid and getattr(reporter, "showfspath", False) and not getattr(reporter, "showlongtestinfo", True):
            reporter.write_fspath_result(self.nodeid, "")  # its newline first, as it sees no file on the line
        else:
            reporter.line("")

    def show(self, text: str) -> None:
        self._write(text, last=False)

    def end(self, text: str) -> None:
        self._write(text, last=True)


class _WorkerNode(Protocol):
    """pytest-xdist's controller of one worker, as ``pytest_configure_node`` gets it."""

    workerinput: dict[str, object]


def _fitted(lines: list[str], config: pytest.Config) -> list[str]:
    """Header lines wrapped to the terminal's width (a hanging indent under each)."""
    width = marks.terminal_width(config)
    if all(len(line) <= width for line in lines):
        return lines
    from ..reports.text import wrap_text

    return [wrap_text(line, width) for line in lines]
