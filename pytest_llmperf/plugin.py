"""pytest wiring: options, the marker, fixtures, and the hooks that turn budgets into results.

Thin on purpose: measuring lives in ``runner``/``engines``, budgets in ``budgets``, text in
``report``. A budget breach fails *that* test (as pytest-memray does), through
``pytest_runtest_makereport``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generator

import pytest

from .errors import ConfigError, EngineError, LLMPerfError
from .fixture import LLMPerf
from .report import metrics_table, properties, rows_from_properties, summary_table
from .schema import MarkerConfig, marker_help, validate
from .settings import INI_HELP, EngineSettings, resolve

MARKER = "llmperf"
MARKER_CONFIG = pytest.StashKey[MarkerConfig]()
FIXTURE = pytest.StashKey[LLMPerf]()
PLUGIN_NAME = "llmperf-manager"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmperf", "LLM inference performance (pytest-llmperf)")
    group.addoption(
        "--llmperf-model",
        dest="llmperf_model",
        default=None,
        help="GGUF model path, or a synthetic preset: tiny (default), small. Env: LLMPERF_MODEL",
    )
    group.addoption("--llmperf-threads", dest="llmperf_threads", default=None, help="llama.cpp threads")
    group.addoption("--llmperf-n-ctx", dest="llmperf_n_ctx", default=None, help="llama.cpp context size")
    group.addoption("--llmperf-n-batch", dest="llmperf_n_batch", default=None, help="prompt batch size")
    group.addoption(
        "--llmperf-gpu-layers", dest="llmperf_gpu_layers", default=None, help="layers offloaded to a GPU"
    )
    for name, text in INI_HELP.items():
        parser.addini(name, text)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", marker_help())
    try:
        settings = resolve(config.getoption, config.getini)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(LLMPerfPlugin(settings), PLUGIN_NAME)


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
        kwargs.update(mark.kwargs)
        args += mark.args
    return validate(kwargs, args)


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> LLMPerf:
    """Measures the ``llmperf`` marker's workload; call ``llmperf.measure()`` (or let the
    plugin do it after the test body when the test did not)."""
    plugin = _plugin(request.config)
    config = request.node.stash.get(MARKER_CONFIG, None) or MarkerConfig({}, {})
    fixture = LLMPerf(config, plugin.engine)
    request.node.stash[FIXTURE] = fixture
    return fixture


@pytest.fixture(autouse=True)
def _llmperf_marked(request: pytest.FixtureRequest) -> None:
    """A test with only the marker gets the ``llmperf`` fixture too (a one-line test works)."""
    if MARKER_CONFIG in request.node.stash:
        request.getfixturevalue("llmperf")


@pytest.fixture(scope="session")
def llmperf_engine(pytestconfig: pytest.Config) -> Any:
    """The session's LlamaCppEngine (loaded once)."""
    try:
        return _plugin(pytestconfig).engine()
    except LLMPerfError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def llm(llmperf_engine: Any) -> Any:
    """The session's ``llama_cpp.Llama`` object: the model the llmperf tests measure."""
    return llmperf_engine.llm


class LLMPerfPlugin:
    """Session state: the engine (loaded lazily, once) and the summary rows."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._engine: Any = None
        self._engine_error: str | None = None
        self.rows: list[dict[str, Any]] = []

    def engine(self) -> Any:
        if self._engine is None and self._engine_error is None:
            try:
                self._engine = load_engine(self.settings)
            except LLMPerfError as exc:
                self._engine_error = str(exc)
        if self._engine_error is not None:
            raise EngineError(self._engine_error)
        return self._engine

    # -- header and collection ------------------------------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> str:
        from .engines.llama_cpp import default_threads, llama_cpp_version
        from .model_facts import describe_model

        s = self.settings
        return (
            f"llmperf: model {describe_model(s)}, threads {s.threads or default_threads()}, "
            f"n_ctx {s.n_ctx}, llama-cpp-python {llama_cpp_version() or 'NOT INSTALLED'}"
        )

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
        if fixture is not None and not fixture.results and MARKER_CONFIG in item.stash:
            fixture.measure()
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, Any]:
        fixture = item.stash.get(FIXTURE, None)
        results = fixture.results if fixture is not None and call.when == "call" else []
        for r in results:
            # On the item, so they reach every later report (JUnit reads the teardown one).
            item.user_properties.extend(properties(r.measurement, r.failure, r.n_budgets))
        report = yield
        for r in results:
            title = "llmperf" + (f" [{r.measurement.label}]" if r.measurement.label else "")
            report.sections.append((title, metrics_table(r.measurement)))
        failures = [r.failure for r in results if r.failure is not None]
        if failures and report.passed:
            report.outcome = "failed"
            report.longrepr = "\n".join(f.as_longrepr() for f in failures)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Runs on the xdist controller too: rows come from the serialized user properties.
        if report.when == "call":
            self.rows.extend(rows_from_properties(report.nodeid, report.user_properties))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        verbosity = terminalreporter.config.get_verbosity()
        over = sum(1 for r in self.rows if str(r.get("budget", "")).startswith("FAIL"))
        if verbosity <= -2:
            return
        if verbosity == -1:
            terminalreporter.write_line(
                f"llmperf: {len(self.rows)} measurement(s), {over} over budget (drop -q for the table)"
            )
            return
        terminalreporter.write_sep("-", "llmperf summary")
        terminalreporter.write_line(summary_table(self.rows))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def load_engine(settings: EngineSettings) -> Any:
    from .engines.llama_cpp import LlamaCppEngine
    from .synthetic import ensure_model

    path: str | Path = ensure_model(settings.preset) if settings.preset else settings.model
    return LlamaCppEngine(
        path,
        n_ctx=settings.n_ctx,
        n_threads=settings.threads,
        n_batch=settings.n_batch,
        n_gpu_layers=settings.gpu_layers,
        name=settings.model_label,
    )
