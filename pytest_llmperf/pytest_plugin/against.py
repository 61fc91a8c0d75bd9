"""The controller's pytest hooks for ``--llmperf-against``: an llmperf test is not run in this
process but on both sides (``session/against.py``); the current side's reports, with the
verdict against REF on them, are logged as this test's. Other tests run here as always."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import pytest

from ..core.errors import LLMPerfError
from . import marks


class AgainstHooks:
    def __init__(self, config: pytest.Config, session: Any) -> None:
        from ..session.refs import resolve_reference

        self.config = config
        self.session = session
        self.text = session.settings.against
        try:
            resolve_reference(self.text, session.settings.rootdir)  # a wrong REF: one line now, not per test
        except LLMPerfError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.against: Any = None
        self.error: str | None = None
        self.next_perf: dict[str, str | None] = {}
        self.old_sigterm: Any = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        perf = [item.nodeid for item in session.items if marks.is_perf(item)]
        self.next_perf = dict(zip(perf, [*perf[1:], None]))

    def _open(self) -> Any:
        if self.against is None and self.error is None:
            from ..models.gguf import default_cache_dir
            from ..session.against import open_against

            s = self.session.settings
            # SIGTERM (a CI job cancelled) ends the session as Ctrl-C does: the sides are closed
            # (and a checkout under way is not cut off, leaving git's worktree locked).
            with contextlib.suppress(ValueError):  # not the main thread: the default stays
                self.old_sigterm = signal.signal(signal.SIGTERM, _interrupt)
            try:
                self.against = open_against(
                    self.text, s.rootdir, default_cache_dir(),
                    [*self.config.invocation_params.args, f"--rootdir={self.config.rootpath}"],
                    str(self.config.invocation_params.dir), alpha=s.alpha, threshold=s.threshold,
                    tail_threshold=s.tail_threshold, family=max(self.session.family_size, 1),
                    timeout_s=s.engine.engine_timeout,
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
                    if report.when == "call" and outcome.notes:
                        report.sections.append(("llmperf against", "\n".join(outcome.notes)))
                    ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _log_failure(self, item: pytest.Item, line: str) -> None:
        for when, outcome, longrepr in (("setup", "passed", None), ("call", "failed", line),
                                        ("teardown", "passed", None)):
            report = pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome,
                                       longrepr, when, user_properties=list(item.user_properties))
            item.ihook.pytest_runtest_logreport(report=report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.against is not None:
            for line in self.against.describe():
                terminalreporter.write_line(self.session.redact(line))

    def close(self) -> None:
        if self.against is not None:
            self.against.close()
            self.against = None
        if self.old_sigterm is not None:
            signal.signal(signal.SIGTERM, self.old_sigterm)
            self.old_sigterm = None


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")
