"""pytest wiring: the marker, fixtures, and the hooks that turn budgets into results.

Thin on purpose: options live in ``options``, measuring in ``runner``/``engines``, budgets in
``budgets``, text in ``report``. A budget breach fails *that* test (as pytest-memray does), through
``pytest_runtest_makereport``.

Loaded by every pytest run where the package is installed, so this module imports only what
the options and the marker need: numpy, scipy, llama_cpp and the reports are imported inside
the hooks that run once an llmperf test is collected (tests/test_plugin_cli.py checks).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator

import pytest

from . import hookcalls
from ..core.errors import ConfigError, EngineError, LLMPerfError
from .options import add_options
from ..judge.marker import PROMPT_KEYS, MarkerConfig, marker_help, validate
from ..core.settings import SERVER_N_CTX, DEFAULT_ALPHA, DEFAULT_TAIL_THRESHOLD, DEFAULT_THRESHOLD, EngineSettings, resolve, threads_warning

if TYPE_CHECKING:
    from ..baselines.store import BaselineError
    from ..core.fingerprint import Fingerprint
    from .fixture import LLMPerf
    from ..measuring.metrics import Measurement
    from ..judge.regression import BaselineVerdict

MARKER = "llmperf"
XDIST_GROUP = "llmperf"
MARKER_CONFIG = pytest.StashKey[MarkerConfig]()
FIXTURE = pytest.StashKey["LLMPerf"]()
PLUGIN_NAME = "llmperf-manager"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs  # pluggy only: fingerprint, result and engine hooks (docs/hooks.md)

    pluginmanager.add_hookspecs(hookspecs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", marker_help())
    # pytest-xdist: perf tests side by side measure each other. Its default "load" becomes
    # "loadgroup", which keeps the llmperf tests (marked xdist_group("llmperf") at
    # collection) on one worker and spreads the others as before.
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
    if getattr(config, "workerinput", {}).get("llmperf_dist") == "loadgroup":
        config.option.loadgroup = True  # a worker re-parses the command line: it cannot tell
    try:
        settings = resolve(config.getoption, config.getini)
        _check_modes(config)
        if config.getoption("llmperf_html") and not hasattr(config, "workerinput"):
            from ..reports.figures import require_matplotlib

            require_matplotlib()  # say what to install now, not after the whole session
    except LLMPerfError as exc:
        raise pytest.UsageError(str(exc)) from None
    plugin = LLMPerfPlugin(config, settings)
    try:  # the session history (pytest_llmperf/history): a bad location is one line, now
        from ..history.location import resolve as history_location

        plugin.history = history_location(config.getoption, config.getini, config.rootpath)
    except LLMPerfError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(plugin, PLUGIN_NAME)


def _check_modes(config: pytest.Config) -> None:
    """Options that contradict each other: one line each, before anything runs."""
    pairs = [
        ("llmperf_skip", "llmperf_only", "--llmperf-skip and --llmperf-only exclude each other"),
        ("llmperf_budgets_only", "llmperf_baselines_only",
         "--llmperf-budgets-only and --llmperf-baselines-only exclude each other; give neither to gate on both"),
        ("llmperf_disable", "llmperf_update_baselines",
         "--llmperf-disable measures once without statistics: it cannot record baselines "
         "(drop one of --llmperf-disable, --llmperf-update-baselines)"),
    ]
    for a, b, message in pairs:
        if config.getoption(a) and config.getoption(b):
            raise ConfigError(message)


def _plugin(config: pytest.Config) -> "LLMPerfPlugin":
    return config.pluginmanager.get_plugin(PLUGIN_NAME)


def marker_config(item: pytest.Item) -> MarkerConfig | None:
    """Module, class and function markers merged; the closest one wins per key."""
    marks = list(item.iter_markers(MARKER))
    if not marks:
        return None
    kwargs: dict[str, Any] = {}
    args: tuple[Any, ...] = ()
    for mark in reversed(marks):
        if PROMPT_KEYS & mark.kwargs.keys():  # prompt and prompt_tokens are one choice
            for key in PROMPT_KEYS:
                kwargs.pop(key, None)
        kwargs.update(mark.kwargs)
        args += mark.args
    return validate(kwargs, args)


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> "LLMPerf":
    """Measures the ``llmperf`` marker's workload; call ``llmperf.measure()`` (or let the
    plugin do it after the test body when the test did not)."""
    from .fixture import LLMPerf

    plugin = _plugin(request.config)
    config = request.node.stash.get(MARKER_CONFIG, None) or MarkerConfig({}, {})
    item = request.node
    fixture = LLMPerf(
        config,
        plugin.engine,
        lambda m, c: plugin.assess(item, m, c),
        plugin.measure_options,
        smoke=plugin.disabled,
    )
    request.node.stash[FIXTURE] = fixture
    return fixture


@pytest.fixture(scope="session")
def llmperf_engine(pytestconfig: pytest.Config) -> Any:
    """The session's LlamaCppEngine (loaded once)."""
    try:
        return _plugin(pytestconfig).engine()
    except LLMPerfError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy


@pytest.fixture(scope="session")
def llmperf_server(pytestconfig: pytest.Config) -> Any:
    """llama-cpp-python's OpenAI-compatible server on a free loopback port, serving the
    session's model with its thread count; ``.url`` and ``.engine()`` give an HttpEngine."""
    from ..engines.servers import serve
    from ..models.synthetic import ensure_model

    s = _plugin(pytestconfig).settings
    try:
        path = ensure_model(s.preset) if s.preset else s.model
        with serve(path, n_threads=s.threads, n_ctx=s.n_ctx or SERVER_N_CTX, n_batch=s.n_batch, alias=s.model_label) as server:
            yield server
    except LLMPerfError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy


@pytest.fixture(scope="session")
def llmperf_llama_server(pytestconfig: pytest.Config) -> Any:
    """llama.cpp's own ``llama-server`` (continuous batching, ``LLAMA_SERVER_PARALLEL`` slots,
    ``/metrics``) on a free loopback port, serving the session's model; built on first use
    (``llmperf server build``). ``.url`` and ``.engine()`` as for ``llmperf_server``."""
    from ..engines.servers import LLAMA_SERVER_PARALLEL, serve_llama_server
    from ..models.synthetic import ensure_model

    s = _plugin(pytestconfig).settings
    try:
        path = ensure_model(s.preset) if s.preset else s.model
        with serve_llama_server(
            path, parallel=LLAMA_SERVER_PARALLEL, n_threads=s.threads, n_ctx=s.n_ctx or SERVER_N_CTX, n_batch=s.n_batch,
            alias=s.model_label,
        ) as server:
            yield server
    except LLMPerfError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy


@pytest.fixture(scope="session")
def llmperf_llm(llmperf_engine: Any) -> Any:
    """The session's ``llama_cpp.Llama`` object: the model the llmperf tests measure."""
    return llmperf_engine.llm


@dataclasses.dataclass(frozen=True)
class Assessment:
    """A measurement's record and what its baseline says, ready to travel on the report."""

    key: str
    baseline_file: str
    hardware_key: str
    record: dict[str, Any]
    verdict: "BaselineVerdict | None"
    baseline_record: dict[str, Any] | None = None  # the entry the verdict compared against (HTML plots)


class LLMPerfPlugin:
    """Session state: the engine (loaded lazily, once), baselines read, results collected."""

    def __init__(self, config: pytest.Config, settings: EngineSettings) -> None:
        self.config = config
        self.settings = settings
        self._engine: Any = None
        self._engine_error: str | None = None
        self.rows: list[dict[str, Any]] = []
        self.results: list[Any] = []  # judge.result.MeasurementResult of each assessed measurement
        self._baselines: dict[Path, dict[str, Any] | BaselineError] = {}
        self._fingerprints: dict[Any, Fingerprint] = {}
        self._hardware: dict[str, Any] | None = None
        self._peaks: Any = None
        self.started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        option = config.getoption
        ini_dir = config.getini("llmperf_baseline_dir")
        self.baseline_dir = Path(config.rootpath) / (option("llmperf_baseline_dir") or ini_dir or "baselines")
        self.update = bool(option("llmperf_update_baselines"))
        #: --llmperf-disable: each measurement runs once; no budgets, statistics or baselines.
        self.disabled = bool(option("llmperf_disable"))
        self.compare = not option("llmperf_budgets_only") and not self.disabled
        self.budgets_gate = not option("llmperf_baselines_only") and not self.disabled
        self.columns = option("llmperf_columns")
        # Plain values: the CompareSettings (regression, scipy) is built on first comparison.
        self.compare_values = dict(
            alpha=option("llmperf_alpha") or DEFAULT_ALPHA,
            threshold=DEFAULT_THRESHOLD if option("llmperf_threshold") is None else option("llmperf_threshold"),
            tail_threshold=(
                DEFAULT_TAIL_THRESHOLD if option("llmperf_tail_threshold") is None else option("llmperf_tail_threshold")
            ),
        )
        self.is_worker = hasattr(config, "workerinput")
        self._groups_dir: str | None = None  # xdist controller: workers' group files

    # -- baselines ---------------------------------------------------------------------------

    def fingerprint(self, m: "Measurement") -> "Fingerprint":
        from ..core.fingerprint import Fingerprint, hardware, subject

        key = m.engine
        if key not in self._fingerprints:
            if self._hardware is None:
                self._hardware = hardware()
            hw, subj = dict(self._hardware), subject(m.engine)
            try:  # conftest/plugins add their keys (hookspecs.pytest_llmperf_fingerprint)
                hookcalls.fingerprint(self.config, hw, subj, m.engine)
            except LLMPerfError as exc:
                raise pytest.fail.Exception(str(exc), pytrace=False) from None
            self._fingerprints[key] = Fingerprint(hw, subj)
        return self._fingerprints[key]

    def baselines(self, path: Path) -> dict[str, Any]:
        from ..baselines import store as baseline_store
        from ..baselines.store import BaselineError

        if path not in self._baselines:
            try:
                self._baselines[path] = baseline_store.load(path)
            except BaselineError as exc:
                self._baselines[path] = exc
        loaded = self._baselines[path]
        if isinstance(loaded, BaselineError):
            raise loaded
        return loaded

    def assess(self, item: pytest.Item, m: "Measurement", marker: MarkerConfig) -> Assessment:
        from ..baselines import store as baseline_store
        from ..baselines.store import BaselineError
        from ..baselines.records import record
        from ..judge.regression import BaselineVerdict, CompareSettings, judge

        fp = self.fingerprint(m)
        rec = record(m, fp, commit=_commit(self.config.rootpath), recorded_at=self.started_at)
        if self.compare or self.update:
            from ..baselines import reference

            rec["reference"] = reference.measure()  # after the runs: never inside a timed region
        module = Path(item.path).resolve()
        try:
            rel = module.relative_to(Path(self.config.rootpath).resolve())
        except ValueError:
            rel = Path(module.name)
        path = baseline_store.module_file(self.baseline_dir, rel.as_posix())
        key = baseline_store.entry_key(item.nodeid, m.label)
        verdict = None
        baseline_record = None
        seen = getattr(self, "_measured", {})
        self._measured = seen
        labels = seen.setdefault(item.nodeid, set())
        if m.label not in labels:  # a sequential measurement's later looks are not new members
            labels.add(m.label)
            if len(labels) > 1:
                self.extra_measurements = getattr(self, "extra_measurements", 0) + 1
        if self.compare:
            settings = CompareSettings(
                **{**self.compare_values, **marker.settings},
                family_size=self.family_size or None,
                peers=self.planned_measurements,
            )
            try:
                entries = self.baselines(path).get(key)
                verdict = judge(entries, fp.hardware_key, rec, settings)
                if verdict.status == "compared":
                    baseline_record = entries[fp.hardware_key]
            except BaselineError as exc:
                verdict = BaselineVerdict("error", str(exc))
        return Assessment(
            key, path.relative_to(self.baseline_dir).as_posix(), fp.hardware_key, rec, verdict, baseline_record
        )

    def measure_options(self, engine: Any, marker: MarkerConfig) -> dict[str, Any]:
        """What to measure besides the runs: per-layer timing and the roofline (in-process only;
        a marker's ``layers=True`` on another engine is an error the runner reports)."""
        option = self.config.getoption
        in_process = getattr(engine, "supports_layer_timing", False)  # the engine's declared capability
        layers = marker.options.get("layers", bool(option("llmperf_layers")) and in_process)
        wants_roofline = layers or "min_mbu" in marker.budgets or option("llmperf_roofline")
        wants_roofline = wants_roofline or option("llmperf_peak_bw") or option("llmperf_peak_tflops")
        peaks = None
        if wants_roofline and in_process:
            from ..measuring.machine_peak import machine_peaks

            if self._peaks is None:
                self._peaks = machine_peaks(given_bw_gbs=option("llmperf_peak_bw"), given_tflops=option("llmperf_peak_tflops"))
            peaks = self._peaks
        return {"layers": layers, "peaks": peaks}

    def failure_lines(self, assessment: Assessment) -> list[str]:
        v = assessment.verdict
        if v is None or self.update:
            return []  # updating: the run is recorded as the new baseline (an unreadable file is moved aside)
        if v.status == "error":
            return [v.note]
        if v.status == "no-baseline" and self.config.getoption("llmperf_require_baseline"):
            return [f"{assessment.key}: {v.note} (--llmperf-require-baseline)"]
        if v.status == "other-hardware" and self.config.getoption("llmperf_strict_env"):
            return [f"{v.note} (--llmperf-strict-env)"]
        return v.failure_lines()

    def engine(self, overrides: Any = None) -> Any:
        """The engine a test measures: the session's, or with a test's own llama.cpp settings
        (marker keys ``threads``, ``flash_attn``...) one from the pool (engines/pool.py)."""
        if overrides:
            if self.settings.endpoint:
                raise EngineError(
                    f"llama.cpp settings ({', '.join(overrides)}) need the in-process engine; this session "
                    f"measures the endpoint {self.settings.endpoint}"
                )
            return self.engine_pool().get(_engine_config(self.settings, overrides))
        if self.settings.endpoint:
            if self._engine is None and self._engine_error is None:
                try:
                    self._engine = hookcalls.make_engine(self.config, self.settings, None) or load_engine(self.settings)
                except LLMPerfError as exc:
                    self._engine_error = str(exc)
            if self._engine_error is not None:
                raise EngineError(self._engine_error)
            return self._engine
        base = _engine_config(self.settings)
        pool = self.engine_pool()
        pool.pin(base)  # the llmperf_engine fixture may hold it for the whole session
        return pool.get(base)

    def engine_pool(self) -> Any:
        if getattr(self, "_pool", None) is None:
            from ..engines.pool import EnginePool, load_config

            def load(engine_config: Any) -> Any:  # a conftest's engine first (pytest_llmperf_make_engine)
                return hookcalls.make_engine(self.config, self.settings, engine_config) or load_config(engine_config)

            self._pool = EnginePool(load, self.settings.max_engines)
            self._pool.plan(getattr(self, "_planned_configs", []))
        return self._pool

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.finished(getattr(self, "_planned_by_id", {}).get(nodeid))

    # -- header and collection ------------------------------------------------------------------

    def describe(self) -> list[str]:
        """What the llmperf tests measure (model or endpoint, threads), and a warning when the
        threads asked for exceed the CPUs usable. Loads nothing but file metadata."""
        from ..engines.llama_cpp_native import llama_cpp_version
        from ..models.facts import describe_model
        from ..core.settings import usable_cpus

        s = self.settings
        if s.endpoint:
            lines = [f"llmperf: endpoint {s.endpoint} ({s.api}), model {s.api_model or '(server default)'}"]
            from ..core.workload import PROMPT_CACHE_NOTE

            lines.append(f"llmperf: {PROMPT_CACHE_NOTE}")
        else:
            lines = [
                f"llmperf: model {describe_model(s)}, threads {s.threads or usable_cpus()}, "
                f"n_ctx {s.n_ctx or 'auto'}, llama-cpp-python {llama_cpp_version() or 'NOT INSTALLED'}"
            ]
        if self.disabled:
            lines.append("llmperf: --llmperf-disable: each measurement runs once; no budgets, statistics or baselines")
        warning = None if s.endpoint else threads_warning(s.threads, self._threads_source())
        note = hookcalls.engine_note(self.config)  # a conftest's engine may replace the one named above
        return lines + ([note] if note else []) + ([warning] if warning else [])

    def _threads_source(self) -> str:
        if self.config.getoption("llmperf_threads") is not None:
            return "--llmperf-threads"
        return "$LLMPERF_THREADS" if os.environ.get("LLMPERF_THREADS") else "ini llmperf_threads"

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        lines = []
        dist = getattr(config.option, "dist", "no")
        if dist not in ("no", None):
            # The controller collects nothing itself: say what its workers will measure.
            lines += self.describe()
        if dist == "loadgroup":
            lines.append("llmperf: pytest-xdist --dist loadgroup: llmperf tests run on one worker, others spread")
        elif dist not in ("no", None):
            lines.append(f"llmperf: pytest-xdist --dist {dist} may run llmperf tests side by side; use loadgroup")
        return lines

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        """The model line, once collection found llmperf tests to run (none: not a word)."""
        if self.is_worker or self.config.getoption("llmperf_skip") or not any(_is_perf(i) for i in items):
            return []
        verbosity = config.get_verbosity()
        if verbosity < 0:  # -q: only the warnings; -qq: nothing
            return [line for line in self.describe() if "warning" in line] if verbosity == -1 else []
        return self.describe()

    # -- pytest-xdist: llmperf tests on one worker (see xdist_groups) -------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Controller: tell each worker the distribution mode and where to write its groups."""
        dist = getattr(self.config.option, "dist", "no")
        node.workerinput["llmperf_dist"] = dist
        if dist == "loadgroup":
            if self._groups_dir is None:
                import tempfile

                self._groups_dir = tempfile.mkdtemp(prefix="llmperf-xdist-")
            node.workerinput["llmperf_groups_dir"] = self._groups_dir

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if getattr(config.option, "dist", "no") == "loadgroup" and self._groups_dir is not None:
            from .xdist_groups import make_scheduler

            return make_scheduler(config, log, self._groups_dir)
        return None

    @pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        perf = [i for i in items if _is_perf(i)]
        for item in perf:
            # A test with only the marker gets the ``llmperf`` fixture too (a one-line test
            # works). Requested here, not by an autouse fixture that every plain test pays for.
            names = getattr(item, "fixturenames", None)
            if MARKER_CONFIG in item.stash and names is not None and "llmperf" not in names:
                names.append("llmperf")
        option = self.config.getoption
        if option("llmperf_skip"):
            for item in perf:
                item.add_marker(pytest.mark.skip(reason="llmperf test (--llmperf-skip)"))
            perf = []
        elif option("llmperf_only"):
            perf_ids = {id(i) for i in perf}
            for item in items:
                if id(item) not in perf_ids:
                    item.add_marker(pytest.mark.skip(reason="not an llmperf test (--llmperf-only)"))
        dist = getattr(self.config, "workerinput", {}).get("llmperf_dist")
        if self.is_worker and dist == "loadgroup":
            from .xdist_groups import item_group, write_groups

            perf_ids = {id(i) for i in perf}
            for item in perf:
                item.add_marker(pytest.mark.xdist_group(XDIST_GROUP))
            groups = [(i.nodeid, item_group(i, id(i) in perf_ids)) for i in items]
            folder = self.config.workerinput.get("llmperf_groups_dir")
            if folder:
                write_groups(folder, self.config.workerinput["workerid"], [(n, g) for n, g in groups if g])
        elif self.is_worker and perf:
            import warnings

            warnings.warn(
                pytest.PytestWarning(
                    f"llmperf: {len(perf)} perf test(s) under pytest-xdist --dist {dist} may run side by side "
                    "and measure each other; use --dist loadgroup (or -p no:xdist)"
                )
            )

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After deselection (-k, -m): Holm's family is what will be measured, one member per
        # judged metric (each phase once, its TPS mirror not counted); labelled measurements
        # beyond a test's first are added as they come (``family_size``).
        self.measuring_tests = sum(1 for i in session.items if _is_perf(i) and not i.get_closest_marker("skip"))
        self.extra_measurements = 0
        self._plan_engines(session.items)

    def _plan_engines(self, items: list[pytest.Item]) -> None:
        """Which llama.cpp settings the markers of the tests to run name (engines/pool.py frees
        an engine after the last of them)."""
        if self.settings.endpoint:
            return
        self._planned_by_id = {}
        for item in items:
            config = item.stash.get(MARKER_CONFIG, None)
            if config is not None and config.engine and not item.get_closest_marker("skip"):
                try:
                    self._planned_by_id[item.nodeid] = _engine_config(self.settings, config.engine)
                except LLMPerfError:
                    continue  # the test fails with that line when it runs
        self._planned_configs = list(self._planned_by_id.values())
        if getattr(self, "_pool", None) is not None:
            self._pool.plan(self._planned_configs)

    @property
    def family_size(self) -> int:
        from ..judge.compare import JUDGED

        return self.planned_measurements * len(JUDGED)

    @property
    def planned_measurements(self) -> int:
        """Measurements this process will judge (tests after deselection, plus labels seen)."""
        return getattr(self, "measuring_tests", 0) + getattr(self, "extra_measurements", 0)

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Generator[None, Any, Any]:
        report = yield
        if not report.passed:
            return report
        errors = []
        for node in report.result:
            if isinstance(node, pytest.Item):
                try:
                    config = marker_config(node)
                except ConfigError as exc:
                    errors.append(f"{node.nodeid}: {exc}")
                    continue
                if config is not None:
                    node.stash[MARKER_CONFIG] = config
                elif _uses_llmperf(node):
                    # Measures through a fixture: carries the mark, so -m "not llmperf" works.
                    node.add_marker(MARKER)
        if errors:
            report.outcome = "failed"
            report.longrepr = "\n".join(errors)
            report.result = []
        return report

    # -- running ---------------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
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
        results = fixture.results if fixture is not None and call.when == "call" else []
        ab = fixture.ab_results if fixture is not None and call.when == "call" else []
        if ab:
            from ..judge.ab.report import attach, properties as ab_properties

            item.user_properties.extend(ab_properties(ab))
        if not results:
            report = yield
            return attach(report, ab) if ab else report
        from ..judge.result import result_of
        from ..reports.text import metrics_table

        try:  # each result through pytest_llmperf_result, before anything reports it
            results, hook_error = [hookcalls.result(self.config, item, r) for r in results], None
        except LLMPerfError as exc:
            hook_error = str(exc)
        typed = [result_of(item.nodeid, r) for r in results]  # judge.result: what every report reads
        for t in typed:
            # On the item, so they reach every later report (JUnit reads the teardown one).
            item.user_properties.extend(t.properties())
        report = yield
        lines: list[str] = [hook_error] if hook_error else []
        shipped = []
        for r, t in zip(results, typed):
            m, a = r.measurement, r.baseline
            title = "llmperf" + (f" [{m.label}]" if m.label else "")
            detail = metrics_table(m)
            if a is not None and a.verdict is not None:
                from ..reports import session_file as session_mod

                shown = [dataclasses.replace(t, test=a.key)]
                table = session_mod.comparison_table(shown, self.columns, self.width())
                undecided = session_mod.undecided_lines(shown)
                # An error note is the test's failure line already: not a second copy here.
                extra = [a.verdict.note] if a.verdict.note and a.verdict.status != "error" else []
                if a.verdict.changes:
                    extra.append("changed since the baseline: " + ", ".join(a.verdict.changes))
                if a.verdict.layer_changes:
                    slower = a.verdict.slower_layers
                    extra.append(
                        "slower layers: " + "; ".join(c.line() for c in slower)
                        if slower
                        else f"per-layer diff: no layer significantly slower ({len(a.verdict.layer_changes)} compared)"
                    )
                detail += "\n\n" + "\n".join(extra + ([table] if table else []) + undecided)
            report.sections.append((title, detail.rstrip()))
            if r.failure is not None and self.budgets_gate:
                lines.append(r.failure.as_longrepr())
            if a is not None:
                lines += self.failure_lines(a)
            shipped.append(t.to_json())
        if shipped:
            report.llmperf = shipped  # judge.result's JSON: crosses xdist's wire to the controller
        if lines and report.passed:
            report.outcome = "failed"
            report.longrepr = "\n".join(lines)
        return attach(report, ab) if ab else report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Runs on the xdist controller too: the results come from the serialized report.
        shipped = getattr(report, "llmperf", None) if report.when == "call" else None
        if shipped:
            from ..judge.result import MeasurementResult

            # Written by to_json in this same package: not re-validated, so the controller's
            # work stays small while a worker may be measuring on the next core.
            for r in (MeasurementResult.from_json(doc, check=False) for doc in shipped):
                self.rows.append(r.summary_row())
                if r.assessed:  # recorded for the baselines: the session's files and verdicts
                    self.results.append(r)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, Any]:
        result = yield
        # Every result is in (with pytest-xdist, from every worker): the suite-relative check.
        # Like a coverage threshold, a failure found here fails the session, not one test.
        self.suite_failures: list[str] = []
        if self.compare and not self.update and not self.disabled and not self.is_worker and self.results:
            from ..judge.regression import CompareSettings
            from ..judge.session_verdicts import suite_check

            peers = len({(r.test, r.label) for r in self.results})
            settings = CompareSettings(**self.compare_values, peers=max(peers, self.planned_measurements))
            self.results, self.suite_failures = suite_check(self.results, settings)
            if self.suite_failures:
                session.testsfailed += 1
        return result

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker:
            return
        option = self.config.getoption
        if not (self.results or self.rows or any(option(f"llmperf_{o}") for o in ("json", "html", "markdown"))):
            return  # no llmperf test ran and no report asked for: nothing to write or import
        from ..reports import session_file as session_mod

        from ..judge.session_verdicts import session_holm

        self.written = []
        self.results = session_holm(self.results)  # the "p (Holm)" shown: over every comparison of the session
        self.write_errors: list[str] = []  # one line each; the tests keep their outcomes
        if self.update and self.results:
            self.written = session_mod.write_baselines(self.baseline_dir, self.results, self.write_errors)
        html_results: Any = [r.to_json() for r in self.results]  # the HTML report and history read the JSON
        if getattr(self, "history", None) is not None and self.results and not self.disabled:
            from ..history import keep

            self.history_line, html_results = keep(
                self.history, html_results, self.started_at, self.config.rootpath, self.compare,
                trends=bool(self.config.getoption("llmperf_html")),
            )
        json_path = self.config.getoption("llmperf_json")
        if json_path:
            self._write(Path(json_path), session_mod.session_json(self.results, self.started_at))
        html_path = self.config.getoption("llmperf_html")
        md_path = self.config.getoption("llmperf_markdown")
        md_extra: list[str] = []
        self.html_written = self.html_error = None
        if html_path:
            from ..reports import html as html_report

            try:
                self.html_written = html_report.write_html(Path(html_path), html_results, self.started_at)
                md_extra = html_report.markdown_lines(Path(html_path), Path(md_path) if md_path else None, html_results)
            except (OSError, LLMPerfError) as exc:
                self.html_error = f"llmperf: HTML report not written: {exc}"
        md = session_mod.markdown(self.results, md_extra, budgets_gate=self.budgets_gate) if self.results else ""
        if md_path and md:
            self._write(Path(md_path), md)
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary and md:
            step_extra = [f"Plots: HTML report `{html_path}` (keep it as a CI artifact)."] if self.html_written else []
            try:
                with open(step_summary, "a", encoding="utf-8") as fh:
                    fh.write(session_mod.markdown(self.results, step_extra, budgets_gate=self.budgets_gate))
            except OSError as exc:
                self.write_errors.append(f"llmperf: cannot write {step_summary}: {exc.strerror or exc}")

    def _write(self, path: Path, text: str) -> None:
        from ..baselines import store as baseline_store

        try:
            baseline_store.atomic_write(path, text)
        except OSError as exc:
            self.write_errors.append(f"llmperf: cannot write {path}: {exc.strerror or exc}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in getattr(self, "write_errors", []):
            terminalreporter.write_line(line)
        history_line = getattr(self, "history_line", None)
        if history_line and (terminalreporter.config.get_verbosity() >= 0 or "not written" in history_line):
            terminalreporter.write_line(history_line)
        if getattr(self, "html_error", None):
            terminalreporter.write_line(self.html_error)
        elif getattr(self, "html_written", None):
            terminalreporter.write_line(f"llmperf: HTML report written to {self.html_written}")
        if getattr(self, "suite_failures", None):
            terminalreporter.write_sep("-", "llmperf: slower than the rest of the suite (fails the session)", red=True)
            for line in self.suite_failures:
                terminalreporter.write_line(line)
        if not self.rows:
            return
        from ..reports import session_file as session_mod
        from ..reports.text import summary_table

        verbosity = terminalreporter.config.get_verbosity()
        over = sum(1 for r in self.rows if str(r.get("budget", "")).startswith("FAIL"))
        if verbosity <= -2:
            return
        if self.disabled:
            terminalreporter.write_line(
                f"llmperf: {len(self.rows)} measurement(s) run once (--llmperf-disable): "
                "no budgets, statistics or baselines"
            )
            return
        if verbosity == -1:
            terminalreporter.write_line(
                f"llmperf: {len(self.rows)} measurement(s), {over} over budget (drop -q for the table)"
            )
            for line in session_mod.undecided_lines(self.results, short=True):
                terminalreporter.write_line(line)
            return
        width = self.width(terminalreporter)
        terminalreporter.write_sep("-", "llmperf summary")
        terminalreporter.write_line(summary_table(self.rows, self.columns, width))
        from ..measuring.served import overhead_lines

        for line in overhead_lines(self.rows):
            terminalreporter.write_line(line)
        table = session_mod.comparison_table(self.results, self.columns, width)
        if table:
            terminalreporter.write_sep("-", "llmperf baseline comparison")
            terminalreporter.write_line(table)
            for line in session_mod.undecided_lines(self.results, short=True):
                terminalreporter.write_line(line)
        from ..reports.text import short_ids

        short = short_ids([r.test for r in self.results])
        notes = sorted(
            {
                f"{short[r.test]}: {r.verdict.note}"
                for r in self.results
                if r.verdict is not None and r.verdict.note and not self.update and r.verdict.status != "error"
            }
        )
        for note in notes:
            terminalreporter.write_line(note)
        for path, moved in getattr(self, "written", []):
            terminalreporter.write_line(f"llmperf: baselines written to {path}")
            if moved is not None:
                terminalreporter.write_line(f"llmperf: the unreadable old file was kept as {moved}")

    def width(self, terminalreporter: Any = None) -> int:
        """The terminal's width (``$COLUMNS``, else the tty's, else 80): tables fit it."""
        tr = terminalreporter or self.config.pluginmanager.get_plugin("terminalreporter")
        try:
            return int(tr._tw.fullwidth)
        except (AttributeError, TypeError, ValueError):
            import shutil

            return shutil.get_terminal_size().columns

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._groups_dir is not None:
            import shutil

            shutil.rmtree(self._groups_dir, ignore_errors=True)
        if self._engine is not None:
            getattr(self._engine, "close", lambda: None)()  # a hook's engine may have none
            self._engine = None
        if getattr(self, "_pool", None) is not None:
            self._pool.close()


def _uses_llmperf(item: pytest.Item) -> bool:
    return any(name.startswith("llmperf") for name in getattr(item, "fixturenames", ()))


def _is_perf(item: pytest.Item) -> bool:
    """Measures or loads a model: the marker, or an ``llmperf*`` fixture."""
    return MARKER_CONFIG in item.stash or _uses_llmperf(item)


def load_engine(settings: EngineSettings) -> Any:
    if settings.endpoint:
        from ..engines.http import HttpEngine

        return HttpEngine(
            settings.endpoint,
            model=settings.api_model,
            api=settings.api,
            api_key_env=settings.api_key_env,
            request_timeout_s=settings.request_timeout,
            token_timeout_s=settings.token_timeout,
        )
    from ..engines.llama_cpp import LlamaCppEngine
    from ..models.synthetic import ensure_model

    path: str | Path = ensure_model(settings.preset) if settings.preset else settings.model
    return LlamaCppEngine(
        path,
        n_ctx=settings.n_ctx,
        n_threads=settings.threads,
        n_batch=settings.n_batch,
        n_gpu_layers=settings.gpu_layers,
        name=settings.model_label,
    )


@functools.lru_cache(maxsize=None)
def _commit(root: Path) -> str | None:
    """The commit under test: $GITHUB_SHA / $CI_COMMIT_SHA, else git's HEAD, else None."""
    for env in ("GITHUB_SHA", "CI_COMMIT_SHA"):
        if os.environ.get(env):
            return os.environ[env][:12]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _engine_config(settings: EngineSettings, overrides: Any = None) -> Any:
    """``engines.config.EngineConfig`` of the session's settings with a test's own over them
    (imported here: the engine layer loads once an llmperf test runs)."""
    from ..engines.config import EngineConfig

    return EngineConfig.from_settings(settings, overrides)
