"""--llmperf-against's pytest wiring. In the controlling session, its hooks: an llmperf test is
not run in this process but on both sides (``session/against.py``); the current side's reports,
with the verdict against REF on them, are logged as this test's. Other tests run here as always.
And one side: a pytest session of the current tests in a process of its own, which runs the
tests the controller names and measures only when the controller says so.

The controller (``session/against.py``) starts one per side as a ``measuring.worker.Channel``:
``python -m pytest_llmperf.pytest_plugin.side FD_IN FD_OUT`` with ``LLMPERF_SIDE`` (JSON: the
side's name, the pytest arguments, where the code under test comes from). Before pytest starts,
the code under test is redirected to the side's tree (``session.refs.install_redirect``); the
plugin and the tests are the current ones. The side's llama.cpp runs in this process: a native
crash ends the side (the controller fails that test and starts the side again).

Messages (one JSON object per line)::

    side -> controller                                  controller -> side
    {"ev": "ready", "collected", "errors", "broken"}    {"op": "test", "nodeid": ..., "next": ...}
    {"ev": "measure", "label", "workload", ...}         {"op": "run", "index": i}  (i < 0: warm-up)
    {"ev": "trace", "trace": RunTrace fields}           {"op": "done", "verdict": ..., "fail": ...}
    {"ev": "error", "line": ...}  (a run failed)        {"op": "go"}  (an exclusive turn)
    {"ev": "logits", "got": ... | "line": ...}          {"op": "logits", "workload", "forced", "prompt_ids"}
    {"ev": "turn"} / {"ev": "released"}                 {"op": "close"}
    {"ev": "paused"}  (a stepped run, between steps)    {"op": "go"}  (its next step)
    {"ev": "unstepped", "line": ...}  (it cannot pause) {"op": "run", "index": i, "stepped": true}
    {"ev": "report", "reports": [serialized], "outcome": ...}
    {"ev": "exit", "code": ...}  (its pytest session ended: a side never ends it by itself)

``errors`` are the collection errors (node id -> line): such a test is measured on the other
side alone; ``broken`` those raised in the side's code under test (``session.refs.import_failure``,
node id -> where and what): such a test fails.

Between ``measure`` and ``done`` the side does nothing but the runs it is asked for
(``measuring.interleave.SideRuns``: the side's loop, where its clock is read); its session
measures through them (``session.sides.Link``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest

from ..core.errors import LLMPerfError
from ..engines.llama_cpp_native import llama_cpp_version
from ..models.gguf import default_cache_dir
from ..session.refs import (
    import_failure,
    install_redirect,
    locate_project,
    parse_reference,
    redirect_problems,
    resolve_reference,
)
from ..session.sides import SIDE_ENV, Link, SideEnv
from . import marks

if TYPE_CHECKING:
    from types import FrameType

    from ..session import Session, SessionSettings
    from ..session.against import Against


class AgainstHooks:
    def __init__(self, config: pytest.Config, session: Session) -> None:
        self.config = config
        self.session = session
        assert session.settings.against is not None  # made only under --llmperf-against (``plugin``)
        self.text = session.settings.against
        here = config.invocation_params.dir
        rootdir = session.settings.rootdir
        chosen = bool(config.inipath or config.known_args_namespace.rootdir or (rootdir / "setup.py").is_file())
        paths = [here / arg.split("::")[0] for arg in config.args]
        try:  # a wrong REF or a project git:REV cannot hold: one line now, not per test
            self.project = locate_project(parse_reference(self.text)[0], rootdir, here, paths, chosen)
            resolve_reference(self.text, self.project.where)
        except LLMPerfError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.against: Against | None = None
        self.not_compared: str | None = None  # the line that fails a session that compared nothing
        self.error: str | None = None
        self.next_perf: dict[str, str | None] = {}
        self.old_sigterm: Callable[[int, FrameType | None], object] | int | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        perf = [item.nodeid for item in session.items if marks.is_perf(item)]
        self.next_perf = dict(zip(perf, [*perf[1:], None]))

    def _open(self) -> Against | None:
        if self.against is None and self.error is None:
            from ..session.against import open_against

            s = self.session.settings
            # SIGTERM (a CI job cancelled) ends the session as Ctrl-C does: the sides are closed
            # (and a checkout under way is not cut off, leaving git's worktree locked).
            with contextlib.suppress(ValueError):  # not the main thread: the default stays
                self.old_sigterm = signal.signal(signal.SIGTERM, _interrupt)
            try:
                self.against = open_against(
                    self.text,
                    self.project,
                    default_cache_dir(),
                    [*self.config.invocation_params.args, f"--rootdir={self.config.rootpath}"],
                    str(self.config.invocation_params.dir),
                    alpha=s.alpha,
                    threshold=s.threshold,
                    tail_threshold=s.tail_threshold,
                    family=max(self.session.family_size, 1),
                    timeout_s=s.engine.engine_timeout,
                    max_processes=s.max_processes,
                )
            except LLMPerfError as exc:
                self.error = str(exc)
        return self.against

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if item.nodeid not in self.next_perf:
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        against = self._open()
        if against is None:
            self._log_failure(item, str(self.error))
        else:
            outcome = against.run_test(item.nodeid, self.next_perf.get(item.nodeid))
            self.session.note_against(against)  # the sides, for the session file and reports
            if outcome.failure is not None:
                self._log_failure(item, outcome.failure)
            else:
                for data in outcome.reports:
                    report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
                    if report.when == "call":
                        report.sections += [("llmperf against", "\n".join(outcome.notes))] if outcome.notes else []
                        # What the sides are, to the xdist controller too (JSON on its wire).
                        report.llmperf_against = self.session.against_sides
                    ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _log_failure(self, item: pytest.Item, line: str) -> None:
        phases: tuple[tuple[Literal["setup", "call", "teardown"], Literal["passed", "failed"], str | None], ...] = (
            ("setup", "passed", None),
            ("call", "failed", line),
            ("teardown", "passed", None),
        )
        for when, outcome, longrepr in phases:
            report = pytest.TestReport(
                item.nodeid,
                item.location,
                {k: 1 for k in item.keywords},
                outcome,
                longrepr,
                when,
                user_properties=list(item.user_properties),
            )
            item.ihook.pytest_runtest_logreport(report=report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The sides as a call report says them (on the xdist controller: from the worker)."""
        sides = getattr(report, "llmperf_against", None)
        if sides:
            self.session.against_sides = sides

    @pytest.hookimpl(trylast=True)  # after the session's results are all in (``LLMPerfHooks``)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.not_compared = self.session.not_compared_line()
        if self.not_compared and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)  # the session's last lines (docs/against.md)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from ..session.against import describe_sides

        if not self.session.is_worker:
            for line in describe_sides(self.session.against_sides, verbose=terminalreporter.verbosity > 0):
                terminalreporter.write_line(self.session.redact(line))
        if self.not_compared:
            terminalreporter.write_line(self.session.redact(self.not_compared), red=True)

    def close(self) -> None:
        if self.against is not None:
            self.against.close()
            self.against = None
        if self.old_sigterm is not None:
            signal.signal(signal.SIGTERM, self.old_sigterm)
            self.old_sigterm = None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


class SidePlugin:
    """The side's pytest hooks: no xdist, no report files, the controller's run loop."""

    def __init__(self, link: Link, spec: SideEnv) -> None:
        self.link = link
        self.spec = spec
        self.errors: dict[str, str] = {}
        self.broken: dict[str, str] = {}  # collection errors in the code under test: where it failed
        self.reports: list[Mapping[str, object]] = []
        self.config: pytest.Config | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_cmdline_main(self, config: pytest.Config) -> None:
        for name, value in (("numprocesses", None), ("dist", "no"), ("looponfail", False)):
            if hasattr(config.option, name):
                setattr(config.option, name, value)  # the controller runs the sides one test at a time

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config
        for name in ("xmlpath", "htmlpath", "resultlog", "reportlog"):
            if getattr(config.option, name, None):
                setattr(config.option, name, None)  # the controller writes the session's files

    def pytest_exception_interact(
        self,
        node: pytest.Item | pytest.Collector,
        call: pytest.CallInfo[object],
        report: pytest.CollectReport | pytest.TestReport,
    ) -> None:
        """A collection error raised in the side's code under test (not a name the tests lack)."""
        if isinstance(report, pytest.CollectReport) and call.excinfo is not None:
            where = import_failure(call.excinfo.value, Path(self.spec.code_root), self.spec.packages)
            if where:
                self.broken[report.nodeid] = where

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            text = str(report.longrepr).strip().splitlines()
            line = next(
                (ln[1:].strip() for ln in reversed(text) if ln.startswith("E ")), text[-1] if text else "failed"
            )
            self.errors[report.nodeid] = " ".join(line.split())[:400]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        assert self.config is not None
        self.reports.append(self.config.hook.pytest_report_to_serializable(config=self.config, report=report))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        by_id = {item.nodeid: item for item in session.items}
        problems = redirect_problems(Path(self.spec.code_root), self.spec.packages)
        code = {name: getattr(sys.modules.get(name), "__file__", None) for name in self.spec.packages}
        self.link.runs.send(
            {
                "ev": "ready",
                "collected": list(by_id),
                "errors": self.errors,
                "broken": self.broken,
                "problems": problems,
                "python": sys.version.split()[0],
                "llama_cpp": llama_cpp_version(),
                "code": code,
            }
        )
        while True:
            op = self.link.runs.receive()
            item = by_id[op["nodeid"]]
            self.reports = []
            nextitem = by_id.get(op.get("next") or "")
            item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            outcome = next((r["outcome"] for r in self.reports if r.get("outcome") == "failed"), "passed")
            self.link.runs.send(
                {"ev": "report", "reports": self.reports, "outcome": outcome, "line": _failure_line(self.reports)}
            )


def _failure_line(reports: Sequence[Mapping[str, object]]) -> str:
    """The first failure's message in one line (a serialized report's ``longrepr``)."""
    failed = next((r for r in reports if r.get("outcome") == "failed"), None)
    if failed is None:
        return ""
    longrepr = failed.get("longrepr")
    crash = (longrepr.get("reprcrash") or {}) if isinstance(longrepr, dict) else {}
    return " ".join(str(crash.get("message") or longrepr).split())[:400] + _raised_at(crash)


def _raised_at(crash: Mapping[str, object]) -> str:
    """`` (raised at tests/test_x.py:12)``: where the failure was raised, as a path from this
    process's folder (the tests' checkout) where it is under it, so a reader tells the tests'
    code from the code under test (``code_root``); "" when pytest did not say."""
    path, line = crash.get("path"), crash.get("lineno")
    if not path:
        return ""
    try:
        shown = os.path.relpath(str(path))
    except ValueError:  # another drive
        shown = str(path)
    return f" (raised at {shown}{f':{line}' if line else ''})"


def side_settings(settings: SessionSettings) -> SessionSettings:
    """A side's session settings: it measures in process and writes no file (the controller does)."""
    engine = dataclasses.replace(settings.engine, in_process=True)
    settings = dataclasses.replace(settings, registered_reports={})  # no report of its own either
    return dataclasses.replace(
        settings, engine=engine, json=None, html=None, markdown=None, history=None, update_baselines=False, against=None
    )


def main(argv: list[str]) -> int:
    from ..measuring.worker import die_with_parent  # core.measurement: only a side's process

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller decides when this ends
    spec = SideEnv.read(os.environ)
    if spec is None:
        raise SystemExit(f"{SIDE_ENV} is not set: a side is started by --llmperf-against's controller")
    install_redirect(Path(spec.code_root), spec.packages)
    from ..measuring.interleave import SideRuns  # numpy and the engines: after the redirect

    link = Link(SideRuns(os.fdopen(int(argv[0]), "rb"), os.fdopen(int(argv[1]), "wb")))
    plugin = SidePlugin(link, spec)
    args = [*spec.args, "-p", "no:cacheprovider", "-p", "no:llmperf", "-p", "pytest_llmperf.pytest_plugin.plugin"]
    code = pytest.main(args, plugins=[plugin])
    with contextlib.suppress(OSError):
        link.runs.send({"ev": "exit", "code": int(code), "errors": plugin.errors})
    return int(code)


if __name__ == "__main__":
    from pytest_llmperf.pytest_plugin.side import main as side_main  # this module under its own name

    sys.exit(side_main(sys.argv[1:]))
