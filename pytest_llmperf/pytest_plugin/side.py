"""--llmperf-against: its hooks in the controlling session (an llmperf test run on both sides, the
current side's reports logged), and one side: a pytest session of the current tests in a process
of its own.

The controller's pytest hooks for ``--llmperf-against``: an llmperf test is not run in this
process but on both sides (``session/against.py``); the current side's reports, with the
verdict against REF on them, are logged as this test's. Other tests run here as always.

One side of ``--llmperf-against``: a pytest session of the current tests in a process of its
own, which runs the tests the controller names and measures only when the controller says so.

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

Between ``measure`` and ``done`` the side does nothing but the runs it is asked for (and, after
the pairs, its token probabilities for the output agreement: ``measuring.agreement``); its clock
is read here, so the pipe and the controller's work lie outside every timed region. Work that
cannot be paired (an A/B ``compare()``, a load test) waits for an exclusive turn, so it never
runs while the other side works."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import pytest

from ..core.errors import LLMPerfError, NotSteppable
from ..core.workload import Workload
from ..engines import NeedsPromptIds, SteppedRuns, TokenProbabilities, times_layers
from ..engines.llama_cpp_native import llama_cpp_version
from ..measuring.worker import die_with_parent, logits_json, pin
from ..models.gguf import default_cache_dir
from ..session.assess import Assessment
from ..session.refs import (
    import_failure,
    install_redirect,
    locate_project,
    parse_reference,
    redirect_problems,
    resolve_reference,
)
from ..session.sides import SIDE_ENV, SideEnv
from . import marks

if TYPE_CHECKING:
    from ..core.workload import EngineInfo, RunTrace
    from ..engines import Engine, TokenStream
    from ..measuring.attribution import Stepping
    from ..measuring.metrics import Measurement
    from ..session import SessionSettings
    from ..session.against import Against
    from ..session.options import MarkerConfig


class AgainstHooks:
    def __init__(self, config: pytest.Config, session: Any) -> None:
        self.config = config
        self.session = session
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
        self.old_sigterm: Any = None

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
            for line in describe_sides(self.session.against_sides):
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


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


#: The environment variable that makes a pytest process a side (JSON, see the module docstring).
class Link:
    """The side's end of the channel."""

    def __init__(self, requests: IO[bytes], replies: IO[bytes]) -> None:
        self.requests, self.replies = requests, replies
        self.threads: int | None = None  # the session's llama.cpp threads (None: every usable CPU)
        self.attribution: Stepping | None = None  # this side's attribution pass between its steps
        # This process's CPUs before any pinning (none known off Linux: nothing is pinned there).
        self.all_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

    def send(self, message: Mapping[str, object]) -> None:
        self.replies.write((json.dumps(message) + "\n").encode())
        self.replies.flush()

    def receive(self) -> dict[str, Any]:
        line = self.requests.readline()
        if not line:  # the controller is gone: nothing more to do
            os._exit(3)
        message: dict[str, Any] = json.loads(line)
        if message.get("op") == "close":
            os._exit(0)
        return message

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Work no other side may overlap (an A/B ``compare()``, a load test)."""
        self.send({"ev": "turn"})
        self.receive()  # {"op": "go"}
        try:
            yield
        finally:
            self.send({"ev": "released"})

    def _pause(self) -> None:
        """A stepped run's pause (``SteppedRuns``): "paused" to the controller, on at its "go"."""
        self.send({"ev": "paused"})
        op = self.receive()
        if op.get("op") != "go":
            raise Called(op)

    def measure(
        self, subject: Engine | TokenStream, config: MarkerConfig, label: str, nodeid: str, *, attribution: bool = False
    ) -> tuple[Measurement, Assessment | None]:
        """The measurement the controller drives: the runs it asks for, then its verdict
        (``attribution``: the test asks for the attribution pass after the pairs)."""
        from ..measuring.agreement import Agreement
        from ..measuring.metrics import RunMetrics, summarize
        from ..measuring.runner import as_engine, measure

        workload = Workload(**config.workload)
        engine = as_engine(subject)
        if workload.is_load:
            with self.turn():
                return measure(engine, workload, label=label, slo=config.budgets), None
        info = engine.info()
        self.send({**self._measure_event(engine, info, workload, config, label), "attribution": attribution})
        op, warm, traces = self._runs(engine, workload)
        if op.get("fail"):
            raise LLMPerfError(op["fail"])
        m = summarize(traces, dataclasses.replace(workload, runs=len(traces)), info, label=label)
        agreement = (op.get("verdict") or {}).get("agreement")
        m = dataclasses.replace(
            m,
            warmup_runs=tuple(RunMetrics.of(t) for t in warm),
            agreement=None if agreement is None else Agreement.from_dict(agreement),
        )
        return m, _assessment(nodeid, label, op.get("verdict"))

    def _measure_event(
        self, engine: Engine, info: EngineInfo, workload: Workload, config: MarkerConfig, label: str
    ) -> dict[str, Any]:
        """What the side tells the controller it measures: the workload, the settings, the
        engine, its threads, and what the output agreement will need."""
        return {
            "ev": "measure",
            "label": label,
            "workload": dataclasses.asdict(workload),
            "settings": dict(config.settings),
            "max_runs": config.options.get("max_runs"),
            "engine": info.describe(),
            # A callable's own threads are unknown: the session's (its llmperf_llm's) stand in.
            "threads": info.threads or config.engine.get("threads") or self.threads,
            # Output agreement (after the pairs): this side's token probabilities, asked by "logits".
            "logits": isinstance(engine, TokenProbabilities),
            # The attribution pass (after the pairs, asked by "attribute"): llama.cpp in process.
            "attributable": times_layers(engine),
            "needs_ids": isinstance(engine, NeedsPromptIds),
            # Pairs token by token (each side's step in turn) when both sides' engines can pause.
            "stepped": isinstance(engine, SteppedRuns),
        }

    def _runs(self, engine: Engine, workload: Workload) -> tuple[dict[str, Any], list[RunTrace], list[RunTrace]]:
        """The runs the controller asks for (each answered with its trace or its error line) and
        the token probabilities it asks for after them, until its "done": (that op, the warm-up
        traces, the timed ones)."""
        warm: list[RunTrace] = []
        traces: list[RunTrace] = []
        while True:
            op = self.receive()
            if op["op"] == "logits":  # after every run of both sides: never inside a timed region
                self.send(_token_logits(engine, op))
                continue
            if op["op"] == "attribute":  # after the pairs, as "logits": the attribution pass, run by run
                self.send(self._attribute(engine, workload, traces, op))
                continue
            if op["op"] != "run":
                return op, warm, traces
            # Before the run's first clock read. No CPUs given: all of them again (an earlier
            # test's pinning must not hold a later test with more threads to fewer CPUs).
            pin(op.get("cpus") or self.all_cpus)
            try:
                trace = self._run(engine, workload, int(op["index"]), stepped=bool(op.get("stepped")))
            except Called as called:  # the controller ended the run during a pause
                return called.op, warm, traces
            if trace is not None:
                (warm if op["index"] < 0 else traces).append(trace)
                self.send({"ev": "trace", "trace": dataclasses.asdict(trace)})

    def _attribute(
        self, engine: Engine, workload: Workload, traces: list[RunTrace], op: Mapping[str, Any]
    ) -> dict[str, Any]:
        """One step of this side's attribution pass (open, warm, run, result, close), its result
        with this side's roofline and memory figures, or one line why it has none."""
        from ..measuring.runner import pass_of, traces_figures

        step, one = op.get("step"), self.attribution
        try:
            if step == "open":
                if one is not None:  # a pass the controller left open (it lost the other side)
                    one.close()
                self.attribution = None
                self.attribution = pass_of(engine, workload)
            elif one is None:
                return {"ev": "attribution", "line": f"attribution step {step!r} without an open pass"}
            elif step == "warm":
                one.warm_up()
            elif step == "run":
                one.run(int(op["index"]))
            else:
                self.attribution = None
                if step == "result":
                    return {
                        "ev": "attribution",
                        "got": one.result().to_json(),
                        "figures": traces_figures(engine, workload, traces),
                    }
                one.close()
        except Exception as exc:  # noqa: BLE001 - one line to the controller, its verdict says it
            if self.attribution is not None:
                self.attribution.close()
                self.attribution = None
            return {
                "ev": "attribution",
                "line": str(exc) if isinstance(exc, LLMPerfError) else f"{type(exc).__name__}: {exc}",
            }
        return {"ev": "attribution"}

    def _run(self, engine: Engine, workload: Workload, index: int, *, stepped: bool = False) -> RunTrace | None:
        """One run (``stepped``: token by token, each step when the controller says "go"); a
        failed one is one line to the controller (None)."""
        try:  # the run's clock reads are all inside engine.run: no pipe, no controller work between them
            if stepped and isinstance(engine, SteppedRuns):
                return engine.run_stepped(workload, index, self._pause)
            return engine.run(workload, index)
        except Called:
            raise
        except NotSteppable as exc:
            self.send({"ev": "unstepped", "line": str(exc)})
            return None
        except Exception as exc:  # noqa: BLE001 - the user's callable too: one line to the controller
            line = str(exc) if isinstance(exc, LLMPerfError) else f"{type(exc).__name__}: {exc}"
            self.send({"ev": "error", "line": line})
            return None


class Called(Exception):
    """The controller answered a pause with another op than "go" (``op``): the run ends there."""

    def __init__(self, op: dict[str, Any]) -> None:
        super().__init__(op.get("op"))
        self.op = op


def _token_logits(engine: Any, op: Mapping[str, Any]) -> dict[str, Any]:
    """The reply to a "logits" op: the engine's ``TokenLogits`` (``worker.logits_json``), or one line."""
    try:
        got = engine.token_logits(
            Workload(**op["workload"]),
            op.get("forced"),
            **({"prompt_ids": op["prompt_ids"]} if op.get("prompt_ids") is not None else {}),
        )
    except Exception as exc:  # noqa: BLE001 - one line to the controller, the agreement says it
        return {"ev": "logits", "line": str(exc) if isinstance(exc, LLMPerfError) else f"{type(exc).__name__}: {exc}"}
    if isinstance(got, str):  # an endpoint that cannot say (``engines.http``)
        return {"ev": "logits", "line": got}
    return {"ev": "logits", "got": logits_json(got)}


def _assessment(nodeid: str, label: str, verdict: Mapping[str, Any] | None) -> Assessment | None:
    """The controller's verdict as the session's ``Assessment`` (nothing recorded: no baseline)."""
    if verdict is None:
        return None
    from ..judge.attribution import AttributionChange
    from ..judge.parts import PartChange
    from ..judge.regression import BaselineVerdict
    from ..judge.result import comparison_from_json

    where = verdict.get("attribution")
    v = BaselineVerdict(
        verdict["status"],
        verdict.get("note", ""),
        tuple(comparison_from_json(c) for c in verdict.get("comparisons", ())),
        changes=tuple(str(c) for c in verdict.get("changes", ())),
        parts=tuple(PartChange.from_json(p) for p in verdict.get("parts", ())),
        attribution=None if where is None else AttributionChange.from_json(where),
    )
    return Assessment(nodeid + (f"[{label}]" if label else ""), "", "", None, v)


class SidePlugin:
    """The side's pytest hooks: no xdist, no report files, the controller's run loop."""

    def __init__(self, link: Link, spec: SideEnv) -> None:
        self.link = link
        self.spec = spec
        self.errors: dict[str, str] = {}
        self.broken: dict[str, str] = {}  # collection errors in the code under test: where it failed
        self.reports: list[dict[str, Any]] = []
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

    def pytest_exception_interact(self, node: Any, call: pytest.CallInfo[Any], report: Any) -> None:
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
        self.link.send(
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
            op = self.link.receive()
            item = by_id[op["nodeid"]]
            self.reports = []
            nextitem = by_id.get(op.get("next") or "")
            item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            outcome = next((r["outcome"] for r in self.reports if r.get("outcome") == "failed"), "passed")
            self.link.send(
                {"ev": "report", "reports": self.reports, "outcome": outcome, "line": _failure_line(self.reports)}
            )


def _failure_line(reports: list[dict[str, Any]]) -> str:
    """The first failure's message in one line (a serialized report's ``longrepr``)."""
    for r in reports:
        if r.get("outcome") != "failed":
            continue
        longrepr = r.get("longrepr")
        where = ""
        if isinstance(longrepr, dict):
            crash = longrepr.get("reprcrash") or {}
            text = str(crash.get("message") or longrepr)
            where = _raised_at(crash)
        else:
            text = str(longrepr)
        return " ".join(text.split())[:400] + where
    return ""


def _raised_at(crash: Mapping[str, Any]) -> str:
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
    return dataclasses.replace(
        settings, engine=engine, json=None, html=None, markdown=None, history=None, update_baselines=False, against=None
    )


def main(argv: list[str]) -> int:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller decides when this ends
    spec = SideEnv.read(os.environ)
    if spec is None:
        raise SystemExit(f"{SIDE_ENV} is not set: a side is started by --llmperf-against's controller")
    install_redirect(Path(spec.code_root), spec.packages)
    link = Link(os.fdopen(int(argv[0]), "rb"), os.fdopen(int(argv[1]), "wb"))
    plugin = SidePlugin(link, spec)
    args = [*spec.args, "-p", "no:cacheprovider", "-p", "no:llmperf", "-p", "pytest_llmperf.pytest_plugin.plugin"]
    code = pytest.main(args, plugins=[plugin])
    with contextlib.suppress(OSError):
        link.send({"ev": "exit", "code": int(code), "errors": plugin.errors})
    return int(code)


if __name__ == "__main__":
    from pytest_llmperf.pytest_plugin.side import main as side_main  # this module under its own name

    sys.exit(side_main(sys.argv[1:]))
