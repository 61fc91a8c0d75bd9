"""One llmperf session without pytest: settings read once, engines, baseline assessments, the
results collected, the files written at the end and the summary lines.

The pytest layer (``pytest_plugin``) creates one ``Session`` per pytest run and hands it plain
values (test ids, module paths, the terminal's width); each test measures through its
``Measurer`` (``session.results``: the one per-test pipeline). A script does the same in three
calls (docs/api.md)::

    session = Session.of(".", threads=1)
    report = session.measure("perf/test_x.py::test_decode", {"max_tokens": 64, "tpot_ms": 50})
    lines = session.end()

Light: imported at every pytest start, so numpy, scipy, llama_cpp and the reports are
imported inside the methods that need them. The engines a session measures: its own (loaded
once), one per llama.cpp setting a test names, or what a hook provides."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import EngineError, LLMPerfError
from ..core.redact import Redactor
from ..core.settings import EngineSettings, threads_warning, usable_cpus
from ..core.workload import PROMPT_CACHE_NOTE, Workload
from ..engines.capabilities import Closable, LlamaObject, SentRequests
from ..engines.llama_cpp_native import EngineConfig, gpu_offload_missing, llama_cpp_version
from ..engines.pool import EnginePool, load_config
from ..models.gguf import describe_model, ensure_model
from .assess import Assessor, FingerprintHook
from .finish import finish, summary, write_trace
from .options import MarkerConfig, SessionSettings, validate
from .results import Measurer

if TYPE_CHECKING:
    from ..core.measurement import Measurement
    from ..core.workload import SentRequest
    from ..engines import CounterSource, TokenStream
    from ..engines.capabilities import Engine
    from ..judge.ab import ABResult
    from ..judge.result import Outcome
    from ..reports.session_file import CallReport
    from .against import Against
    from .finish import Line, Outputs
    from .sides import Link


__all__ = ["Session", "SessionSettings"]


class Session:
    """State of one session. ``is_worker``: a pytest-xdist worker, which measures and ships its
    results to the controller but writes no file."""

    def __init__(
        self,
        settings: SessionSettings,
        *,
        fingerprint_hook: FingerprintHook = lambda *_: None,
        make_engine_hook: MakeEngineHook = lambda *_: None,
        is_worker: bool = False,
        started_at: str | None = None,
    ) -> None:
        self.settings = settings
        self.is_worker = is_worker
        self.started_at = started_at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.engines = Engines(settings.engine, make_engine_hook)
        self.assessor = Assessor(settings, self.started_at, fingerprint_hook)
        #: Summary rows (one per measurement) and the assessed results
        #: (``judge.result.Outcome``), of this process's tests or, on the xdist
        #: controller, of every worker's; A/B comparisons as JSON.
        self.rows: list[dict[str, object]] = []
        self.results: list[Outcome] = []
        #: How many of the measurements (``rows``) went over a budget.
        self.over_budget = 0
        self.ab_results: list[dict[str, object]] = []
        #: Tests that will measure (after deselection) and labelled measurements beyond a
        #: test's first seen so far: the size of Holm's family.
        self.measuring_tests = 0
        self.extra_measurements = 0
        self.labels_seen: dict[str, set[str]] = {}
        self.suite_failures: list[str] = []
        self.outputs: Outputs | None = None
        #: ``{nodeid: marker engine keys}`` of the tests to run (``plan``), for the header's warnings.
        self.planned_engines: dict[str, Any] = {}
        #: On a side of ``--llmperf-against``: the link to the controller, which drives the runs.
        self.side: Link | None = None
        #: Under ``--llmperf-against``, on the controller: what REF and each side are (the session
        #: file's ``against`` object, ``note_against``); None otherwise.
        self.against_sides: dict[str, Any] | None = None

    @classmethod
    def of(cls, rootdir: Path | str, environ: Mapping[str, str] | None = None, **values: object) -> Session:
        """A script's session: ``SessionSettings.of``'s settings, no hooks."""
        return cls(SessionSettings.of(rootdir, environ, **values))

    # -- measuring ---------------------------------------------------------------------------

    def measure(
        self,
        test: str,
        marker: MarkerConfig | Mapping[str, object],
        engine: Engine | TokenStream | None = None,
        *,
        label: str = "",
        module: Path | str | None = None,
        width: int = 80,
    ) -> CallReport:
        """One measurement of test ``test`` (a node id; its module, unless given, is its path
        under the rootdir) by its marker (a ``MarkerConfig`` or the marker's keys), as a test
        of the pytest plugin makes it, sequential looks included; its report parts (a
        measurement that failed: its line first in ``lines``), collected for ``end()``."""
        config = marker if isinstance(marker, MarkerConfig) else validate(marker)
        measurer = self.test(test, config, module)
        error = None
        try:
            measurer.measure(engine, label=label)
        except LLMPerfError as exc:
            error = str(exc)
        report = self.call_report(test, measurer.results, [], width, error)
        self.collect(report.results)
        return report

    def test(self, nodeid: str, marker: MarkerConfig, module: Path | str | None = None, test_id: str = "") -> Measurer:
        """The measurements of one test (``results.Measurer``) with this session's engines,
        assessments and settings; ``test_id``: its full id (``core.formats.full_id``)."""
        where = Path(module) if module is not None else self.settings.rootdir / nodeid.split("::")[0]
        return Measurer(
            marker,
            self.engine,
            lambda m, c: self.assess(nodeid, where, m, c),
            self.assessor.measure_options,
            smoke=self.settings.disable,
            side=self.side,
            nodeid=nodeid,
            release=self.release_model,
            counters=self.handed_counters,
            prompt_cache=self.settings.prompt_cache,
            test_id=test_id,
            seen=self.engines.seen if self.settings.write_trace else lambda engine: None,
            fit_handed=self.fit_handed,
        )

    def engine(self, overrides: Mapping[str, object] | None = None) -> Engine:
        """The engine a test measures (raises EngineError: one line, no secret in it)."""
        try:
            return self.engines.get(overrides)
        except LLMPerfError as exc:
            message = self.redact(str(exc))
            if message != str(exc):
                raise type(exc)(message) from None
            raise

    def redact(self, text: str) -> str:
        """``text`` cleaned of the endpoint URL's and the history location's secrets and of the
        API key (``core.redact``): for lines this layer builds from the settings."""
        s = self.settings
        history = s.history.target if s.history is not None and s.history.kind == "postgresql" else None
        return Redactor.of([s.engine.endpoint, history], [os.environ.get(s.engine.api_key_env)]).text(text)

    def handed_counters(self) -> CounterSource[Any] | None:
        """The llama.cpp counters of the ``llama_cpp.Llama`` the fixtures handed out
        (``llmperf_llm``, ``llmperf_engine``), which a measured callable may drive: read around
        each of its runs, they split its time as the plugin's engine's is split. None: no
        such Llama was handed out in this process."""
        engine = self.engines.handed
        if not isinstance(engine, LlamaObject) or engine.llm is None:
            return None
        from ..engines.llama_cpp import LlamaCounters

        return LlamaCounters(engine.llm, engine.info())

    def fit_handed(self, workload: Workload) -> None:
        """The ``llama_cpp.Llama`` the fixtures handed out (``llmperf_llm``), which a measured
        callable may drive, made ready for ``workload`` before it runs: its context fitted to
        every request (``LlamaCppEngine.fit_handed``), or one line naming what to set. Nothing
        when no such Llama was handed out in this process."""
        from ..engines.llama_cpp import LlamaCppEngine

        engine = self.engines.handed
        if isinstance(engine, LlamaCppEngine):
            engine.fit_handed(workload)

    def release_model(self, path: str) -> None:
        """Close the pool's engines that map the model file ``path`` (a cold load needs the file
        unmapped; a later test loads them again)."""
        if self.engines.pool is not None:
            self.engines.pool.release(path)

    @property
    def planned_measurements(self) -> int:
        """Measurements this process will judge (tests after deselection, plus labels seen)."""
        return self.measuring_tests + self.extra_measurements

    @property
    def family_size(self) -> int:
        from ..judge.rule import JUDGED

        return self.planned_measurements * len(JUDGED)

    def assess(self, nodeid: str, module: Path | str, m: Measurement, marker: MarkerConfig) -> Outcome:
        """Record ``m`` and judge it against its baseline. Raises LLMPerfError (one line) when a
        fingerprint hook answers wrongly."""
        labels = self.labels_seen.setdefault(nodeid, set())
        # A test's second label is one more member; a sequential measurement's later looks are not.
        if labels and m.label not in labels:
            self.extra_measurements += 1
        labels.add(m.label)
        return self.assessor.assess(
            nodeid, Path(module), m, marker, family_size=self.family_size, peers=self.planned_measurements
        )

    def plan(self, measuring_tests: int, engines: Mapping[str, object]) -> None:
        """After collection: how many tests will measure, and the llama.cpp settings their
        markers name (``{nodeid: engine keys}``)."""
        self.measuring_tests = measuring_tests
        self.extra_measurements = 0
        self.planned_engines = dict(engines)
        self.engines.plan(dict(engines))

    def describe(self, engine_note: str | None = None) -> list[str]:
        """The header lines: what the tests measure (``engine_note``: a hook may replace it), and
        a warning for each ``threads`` asked for, by the session or a marker, beyond the CPUs."""
        s = self.settings
        lines = describe(s.engine, s.threads_source, s.disable, engine_note)
        by_threads: dict[int, list[str]] = {}
        for nodeid, keys in self.planned_engines.items():
            if keys.get("threads") is not None and not s.engine.endpoint:
                by_threads.setdefault(keys["threads"], []).append(nodeid)
        for threads, ids in sorted(by_threads.items()):
            more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
            warning = threads_warning(threads, f"{ids[0]}{more}: marker threads")
            lines += [warning] if warning else []
        lines += self._offload_note()
        return [self.redact(line) for line in lines]

    def _offload_note(self) -> list[str]:
        """One line when ``gpu_layers`` asks for layers on a llama.cpp build without GPU offload."""
        s = self.settings
        if s.engine.endpoint or s.disable:
            return []
        asked = [f"--llmperf-gpu-layers {s.engine.gpu_layers}"] if s.engine.gpu_layers else []
        asked += [
            f"{n}: marker gpu_layers={k['gpu_layers']}" for n, k in self.planned_engines.items() if k.get("gpu_layers")
        ]
        if not asked or not gpu_offload_missing():
            return []
        more = f" and {len(asked) - 1} more" if len(asked) > 1 else ""
        return [
            f"llmperf: {asked[0]}{more}: this llama.cpp build has no GPU offload (a CPU-only llama-cpp-python), "
            "so 0 layers are offloaded and everything runs on the CPU (the records say gpu_layers 0)"
        ]

    def note_against(self, against: Against) -> None:
        """What ``--llmperf-against``'s REF and both sides are, from the controller
        (after a test: a side started again reports again), for the
        session file, the Markdown summary and the HTML report."""
        ref = against.reference
        before = (self.against_sides or {}).get("sides", {})
        sides = {}
        for name, side in against.sides.items():
            ready = side.ready or {}
            sides[name] = (
                {
                    "shown": side.spec.shown,
                    "interpreter": side.spec.python,
                    "code_root": side.spec.code_root,
                    "python": ready.get("python"),
                    "llama_cpp": ready.get("llama_cpp"),
                    "code": dict(ready.get("code") or {}),
                }
                if ready or name not in before
                else before[name]
            )
        self.against_sides = {
            "ref": ref.text,
            "described": ref.describe(),
            "sides": sides,
            "decisions": [dict(d) for d in against.decisions],
        }

    def not_compared_line(self) -> str | None:
        """Under ``--llmperf-against``, once every result is in: the line that fails a session none
        of whose measurements was compared with REF (a gate that compared nothing must not pass;
        ``--llmperf-allow-not-compared`` lets it). None when one was, when none was judged (none
        ran, or each failed), on an xdist worker, and without ``--llmperf-against``."""
        from ..judge.verdict import BaselineStatus

        s = self.settings
        verdicts = [r.verdict for r in self.results if r.verdict is not None]
        if not s.against or s.allow_not_compared or self.is_worker or not verdicts:
            return None
        if any(v.status == BaselineStatus.COMPARED for v in verdicts):
            return None
        first = next((f" ({v.note})" for v in verdicts if v.note), "")
        ref = (self.against_sides or {}).get("described") or s.against  # as the controller described it
        return (
            f"llmperf: --llmperf-against {ref}: none of the {len(verdicts)} measurement(s) could be "
            f"compared with REF, so the session fails{first}; --llmperf-allow-not-compared lets it pass"
        )

    # -- reporting ---------------------------------------------------------------------------

    def call_report(
        self,
        test: str,
        results: Sequence[Outcome],
        ab_results: Sequence[ABResult],
        width: int,
        error: str | None = None,
    ) -> CallReport:
        """What one test's call report gets (``reports.session_file.call_report``); ``test``: its
        full id (``core.formats.full_id``)."""
        from ..reports.session_file import call_report

        s = self.settings
        return call_report(
            test,
            results,
            ab_results,
            columns=s.columns,
            width=width,
            budgets_gate=s.budgets_gate,
            failure_lines=self.assessor.failure_lines,
            error=error,
        )

    def collect(self, shipped: Sequence[Outcome], ab_results: Sequence[Mapping[str, object]] = ()) -> None:
        """One test's results and A/B comparisons, made in this process or rebuilt from an
        xdist worker's report (``pytest_plugin.plugin``: JSON only on that wire)."""
        from ..reports.session_file import summary_row

        for r in shipped:
            self.rows.append(summary_row(r))
            self.over_budget += r.over_budget
            if r.assessed or r.verdict is not None:  # the session's files and verdicts (against REF: no record)
                self.results.append(r)
        self.ab_results.extend(dict(r) for r in ab_results)

    def suite_check(self) -> list[str]:
        """Once every result is in: measurements slower than the rest of the suite (fails the
        session, like a coverage threshold; none while recording or in smoke mode)."""
        s = self.settings
        self.suite_failures = []
        if s.compare and not s.update_baselines and not s.against and not self.is_worker and self.results:
            from ..judge.regression import CompareSettings, suite_check

            peers = len({(r.test, r.label) for r in self.results})
            settings = CompareSettings(**s.compare_values, peers=max(peers, self.planned_measurements))
            self.results, self.suite_failures = suite_check(self.results, settings)
        return self.suite_failures

    def finish(self, environ: Mapping[str, str] | None = None) -> Outputs | None:
        """Write baselines, history and reports (not on a worker; nothing when no llmperf test
        ran and no report was asked for). ``outputs.failed``: the session must fail."""
        s = self.settings
        if self.is_worker or not (self.results or self.rows or s.reports or s.write_trace):
            return None
        env = os.environ if environ is None else environ
        if self.assessor.history_unusable:  # said once (its line names the remedy): not tried again
            s = dataclasses.replace(s, history=None)
        self.results, self.outputs = finish(
            s,
            self.results,
            self.ab_results,
            self.started_at,
            env.get("GITHUB_STEP_SUMMARY"),
            self.against_sides,
            planned=self.planned_measurements,
        )
        if s.write_trace:
            self.outputs.trace_line, self.outputs.trace_failed = write_trace(
                s.write_trace, self.engines.sent_requests()
            )
        return self.outputs

    def summary(self, verbosity: int, width: int) -> list[Line]:
        """The terminal summary's llmperf lines (none, and nothing imported, when nothing ran)."""
        if self.outputs is None and not self.rows and not self.suite_failures and not self.ab_results:
            return []
        notes = [self.assessor.history_error] if self.assessor.history_error else []
        return summary(
            self.settings,
            self.rows,
            self.results,
            self.outputs,
            self.suite_failures,
            verbosity=verbosity,
            width=width,
            notes=notes,
            ab=self.ab_results,
            over_budget=self.over_budget,
        )

    def end(self, environ: Mapping[str, str] | None = None, *, verbosity: int = 0, width: int = 80) -> list[Line]:
        """A script's end of the session: the suite check, ``finish()`` (its ``outputs``), the
        engines closed; the summary's lines."""
        self.suite_check()
        self.finish(environ)
        self.close()
        return self.summary(verbosity, width)

    def close(self) -> None:
        self.engines.close()


#: ``fn(settings, engine_config)``: an engine, or None for the default (the pytest layer's
#: ``pytest_llmperf_make_engine``); raises LLMPerfError for a wrong answer.
MakeEngineHook = Callable[[EngineSettings, "EngineConfig | None"], "Engine | None"]


def load_engine(settings: EngineSettings) -> Engine:
    """The session's engine by its settings: the endpoint's HttpEngine, else llama.cpp."""
    if settings.endpoint:
        from ..engines.http import HttpEngine  # asyncio: only an endpoint's session

        return HttpEngine.from_settings(settings.endpoint, settings, settings.api_model)
    from ..engines.llama_cpp import LlamaCppEngine

    path: str | Path = ensure_model(settings.preset) if settings.preset else settings.model
    return LlamaCppEngine(
        path,
        n_ctx=settings.n_ctx,
        threads=settings.threads,
        n_batch=settings.n_batch,
        gpu_layers=settings.gpu_layers,
        name=settings.model_label,
    )


class Engines:
    """The session's engines, each loaded on first use; ``close`` frees them all."""

    def __init__(self, settings: EngineSettings, make_engine: MakeEngineHook) -> None:
        self.settings = settings
        self.make_engine = make_engine
        self.endpoint_engine: Engine | None = None
        self.endpoint_error: str | None = None
        self.pool: EnginePool | None = None
        self.planned_by_id: dict[str, EngineConfig] = {}
        self.local_engine: Engine | None = None  # the session's engine in this process (local()), loaded once
        self.local_error: str | None = None
        #: The engine ``local()`` handed out (to the llmperf_engine and llmperf_llm fixtures), if any.
        self.handed: Engine | None = None
        #: The engines a test measured with that send requests to a server (``seen``), asked for
        #: what they sent at the end (``--llmperf-write-trace``).
        self._senders: list[SentRequests] = []

    def seen(self, engine: object) -> None:
        """An engine a test measures with, under ``--llmperf-write-trace``: one that sends
        requests to a server keeps them from now on, and is asked for them at the end
        (``sent_requests``)."""
        if isinstance(engine, SentRequests) and not any(engine is e for e in self._senders):
            engine.keep_sent = True
            self._senders.append(engine)

    def sent_requests(self) -> list[SentRequest]:
        """Every request the engines a test measured with sent, in the order they were begun."""
        return sorted((r for engine in self._senders for r in engine.take_sent()), key=lambda r: r.sent_ns)

    def get(self, overrides: Mapping[str, object] | None = None) -> Engine:
        """The engine a test measures: the session's, or with a test's own llama.cpp settings
        (marker keys ``threads``, ``flash_attn``...) one from the pool (engines/pool.py).
        Raises EngineError (one line)."""
        s = self.settings
        if overrides:
            if s.endpoint:
                raise EngineError(
                    f"llama.cpp settings ({', '.join(overrides)}) need the in-process engine; this session "
                    f"measures the endpoint {s.endpoint}"
                )
            return self.engine_pool().get(EngineConfig.from_settings(s, overrides))
        if s.endpoint:
            if self.endpoint_engine is None and self.endpoint_error is None:
                try:
                    self.endpoint_engine = self.make_engine(s, None) or load_engine(s)
                except LLMPerfError as exc:
                    self.endpoint_error = str(exc)
            if self.endpoint_error is not None:
                raise EngineError(self.endpoint_error)
            assert self.endpoint_engine is not None  # loaded, or endpoint_error says why not
            return self.endpoint_engine
        base = EngineConfig.from_settings(s)
        pool = self.engine_pool()
        pool.pin(base)  # the llmperf_engine fixture may hold it for the whole session
        return pool.get(base)

    def local(self) -> Engine:
        """The session's engine in this process, for tests that hold the engine or its
        ``llama_cpp.Llama`` object (``llmperf_engine``, ``llmperf_llm``). Unless the session
        measures in process anyway, a throw-away engine worker first loads the same setting and
        runs two tokens: a setting that crashes llama.cpp fails here, with the worker's line,
        instead of ending the session. Raises EngineError (one line)."""
        s = self.settings
        if s.endpoint or s.in_process:
            self.handed = self.get()
            return self.handed
        if self.local_engine is None and self.local_error is None:
            from ..measuring.worker import preflight  # core.measurement: once a test holds the engine

            base = EngineConfig.from_settings(s)
            try:
                self.local_engine = self.make_engine(s, base)
                if self.local_engine is None:
                    preflight(base, timeout_s=s.engine_timeout)
                    self.local_engine = load_config(base)
            except LLMPerfError as exc:
                self.local_error = str(exc)
        if self.local_error is not None:
            raise EngineError(self.local_error)
        assert self.local_engine is not None  # loaded, or local_error says why not
        self.handed = self.local_engine
        return self.local_engine

    def engine_pool(self) -> EnginePool:
        if self.pool is None:
            from ..measuring.worker import load_worker  # core.measurement: once a test measures

            def load(config: EngineConfig) -> Engine:  # a conftest's engine first (pytest_llmperf_make_engine)
                engine = self.make_engine(self.settings, config)
                if engine is not None:
                    return engine
                if self.settings.in_process:
                    return load_config(config)
                return load_worker(config, timeout_s=self.settings.engine_timeout)

            self.pool = EnginePool(load, self.settings.max_engines)
            self.pool.plan(list(self.planned_by_id.values()))
        return self.pool

    def plan(self, planned: dict[str, Any]) -> None:
        """``{nodeid: marker engine keys}`` of the tests to run: the pool frees an engine after
        the last test that names its settings. A bad setting is skipped here: its test fails
        with that line when it runs."""
        if self.settings.endpoint:
            return
        self.planned_by_id = {}
        for nodeid, overrides in planned.items():
            try:
                self.planned_by_id[nodeid] = EngineConfig.from_settings(self.settings, overrides)
            except LLMPerfError:
                continue
        if self.pool is not None:
            self.pool.plan(list(self.planned_by_id.values()))

    def finished(self, nodeid: str) -> None:
        if self.pool is not None:
            self.pool.finished(self.planned_by_id.get(nodeid))

    def close(self) -> None:
        if isinstance(self.local_engine, Closable):
            self.local_engine.close()
        self.local_engine = self.handed = None
        if isinstance(self.endpoint_engine, Closable):
            self.endpoint_engine.close()
        self.endpoint_engine = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def describe(settings: EngineSettings, threads_source: str, disabled: bool, engine_note: str | None) -> list[str]:
    """What the llmperf tests measure (model or endpoint, threads), and a warning when the
    threads asked for exceed the CPUs usable. Loads nothing but file metadata."""
    s = settings
    if s.endpoint:
        lines = [
            f"llmperf: endpoint {s.endpoint} ({s.api}), model {s.api_model or '(server default)'}",
            f"llmperf: {PROMPT_CACHE_NOTE}",
        ]
    else:
        lines = [
            f"llmperf: model {describe_model(s)}, threads {s.threads or usable_cpus()}, "
            f"n_ctx {s.n_ctx or 'auto'}, llama-cpp-python {llama_cpp_version() or 'NOT INSTALLED'}"
        ]
    if disabled:
        lines.append("llmperf: --llmperf-disable: each measurement runs once; no budgets, statistics or baselines")
    warning = None if s.endpoint else threads_warning(s.threads, threads_source)
    return lines + ([engine_note] if engine_note else []) + ([warning] if warning else [])
