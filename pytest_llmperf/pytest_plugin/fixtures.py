"""The plugin's fixtures: the ``llmperf`` measuring object and the session's engine, model and
servers. Each hands the pytest-free ``Session`` plain values and turns its one-line errors
into a test failure without a traceback.

The ``llmperf`` fixture object: measures the marker's workload for one test."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from ..core.errors import LLMPerfError
from ..core.settings import SERVER_N_CTX
from ..core.workload import SEQUENTIAL_FACTOR, SEQUENTIAL_TIME_CAP_S, Workload
from ..session.options import MarkerConfig
from ..session.results import Result
from .marks import FIXTURE, MARKER_CONFIG, session_of

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import llama_cpp

    from ..engines import Engine, TokenStream
    from ..engines.servers import Server
    from ..judge.ab import ABResult
    from ..measuring.metrics import Measurement
    from ..session.assess import Assessment
    from .side import Link

    #: What ``measure()`` and ``compare()`` take as an engine: any Engine, or ``fn(prompt, max_tokens)``.
    Subject = Engine | TokenStream


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """An LLMPerfError inside becomes the test's one failure line (no traceback)."""
    try:
        yield
    except LLMPerfError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy


def _fail(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` with an LLMPerfError raised as the test's one failure line."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with _one_line():
            return call(*args, **kwargs)

    return run


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> LLMPerf:
    """Measures the ``llmperf`` marker's workload; call ``llmperf.measure()`` (or let the
    plugin do it after the test body when the test did not)."""

    session = session_of(request.config)
    item = request.node
    config = item.stash.get(MARKER_CONFIG, None) or MarkerConfig({}, {})
    fixture = LLMPerf(
        config,
        session.engine,
        _fail(lambda m, c: session.assess(item.nodeid, item.path, m, c)),
        session.measure_options,
        smoke=session.settings.disable,
        side=session.side,
        nodeid=item.nodeid,
        release=session.release_model,
    )
    item.stash[FIXTURE] = fixture
    return fixture


@pytest.fixture(scope="session")
def llmperf_engine(pytestconfig: pytest.Config) -> Engine:
    """The session's engine (in-process llama.cpp unless an endpoint or a hook says otherwise; loaded once)."""
    engine: Engine = _fail(session_of(pytestconfig).local_engine)()
    return engine


def _serve(
    pytestconfig: pytest.Config, start: Callable[..., AbstractContextManager[Server]], **kwargs: Any
) -> Iterator[Server]:
    from ..models.gguf import ensure_model

    s = session_of(pytestconfig).settings.engine
    with _one_line():
        path = ensure_model(s.preset) if s.preset else s.model
        with start(
            path, threads=s.threads, n_ctx=s.n_ctx or SERVER_N_CTX, n_batch=s.n_batch, alias=s.model_label, **kwargs
        ) as server:
            yield server


@pytest.fixture(scope="session")
def llmperf_server(pytestconfig: pytest.Config) -> Iterator[Server]:
    """llama-cpp-python's OpenAI-compatible server on a free loopback port, serving the
    session's model with its thread count; ``.url`` and ``.engine()`` give an HttpEngine."""
    from ..engines.servers import serve

    yield from _serve(pytestconfig, serve)


@pytest.fixture(scope="session")
def llmperf_llama_server(pytestconfig: pytest.Config) -> Iterator[Server]:
    """llama.cpp's own ``llama-server`` (continuous batching, ``LLAMA_SERVER_PARALLEL`` slots,
    ``/metrics``) on a free loopback port, serving the session's model; built on first use
    (``llmperf server build``). ``.url`` and ``.engine()`` as for ``llmperf_server``."""
    from ..engines.servers import LLAMA_SERVER_PARALLEL, serve_llama_server

    yield from _serve(pytestconfig, serve_llama_server, parallel=LLAMA_SERVER_PARALLEL)


@pytest.fixture(scope="session")
def llmperf_llm(llmperf_engine: Engine) -> llama_cpp.Llama:
    """The session's ``llama_cpp.Llama`` object: the model the llmperf tests measure."""
    from ..engines import LlamaObject

    llm: llama_cpp.Llama | None = llmperf_engine.llm if isinstance(llmperf_engine, LlamaObject) else None
    if llm is None:
        raise pytest.fail.Exception(
            f"llmperf_llm: the session's engine ({type(llmperf_engine).__name__}, from an --llmperf-endpoint or a "
            "pytest_llmperf_make_engine hook) has no llama_cpp.Llama object; use the llmperf_engine fixture",
            pytrace=False,
        )
    return llm


#: Workload keys ``--llmperf-disable`` overrides: one run, no warm-up (a smoke test).
SMOKE = {"runs": 1, "warmup": 0}


def _model_load(config: MarkerConfig) -> str | None:
    """The fresh loads a test asks for: its ``model_load`` key, or warm ones for a ``max_load_ms``."""
    kind = config.options.get("model_load", "warm" if "max_load_ms" in config.budgets else None)
    return None if kind is None else str(kind)


def _undecided(assessment: Assessment | None) -> bool:
    """More runs may decide the baseline comparison: it is undecided, and the machine was not
    busier than at baseline (a busy machine's runs measure its neighbours: more of them cannot
    decide anything about the subject)."""
    verdict = getattr(assessment, "verdict", None)
    if verdict is None or verdict.status != "compared" or getattr(verdict, "machine", ""):
        return False
    return any(c.worth_more_runs for c in verdict.comparisons)


class LLMPerf:
    """Bound to one test: ``measure()`` runs the workload and records it for the report.

    Keyword arguments to ``measure`` are marker keys and override the marker for that call;
    ``engine`` may be any Engine or a callable ``fn(prompt, max_tokens)`` yielding tokens.
    ``smoke`` (``--llmperf-disable``): one run each, no budgets, no baseline assessment.
    """

    def __init__(
        self,
        marker: MarkerConfig,
        engine_factory: Callable[..., Engine],
        assess: Callable[[Measurement, MarkerConfig], Assessment | None] = lambda m, c: None,
        measure_options: Callable[[Subject, MarkerConfig], Mapping[str, Any]] = lambda engine, c: {},
        *,
        smoke: bool = False,
        side: Link | None = None,
        nodeid: str = "",
        release: Callable[[str], None] = lambda path: None,
    ) -> None:
        self._marker = marker
        #: A side of ``--llmperf-against`` (``side.Link``): the controller drives the runs.
        self._side = side
        self._nodeid = nodeid
        self._smoke = smoke
        self._measure_options = measure_options
        self._engine_factory = engine_factory
        self._assess = assess
        #: Closes the engines that map a model file (before cold loads: ``runner.with_model_loads``).
        self._release = release
        self.results: list[Result] = []
        self.ab_results: list[ABResult] = []  # of each compare()

    @property
    def engine(self) -> Engine:
        """The llama.cpp engine this test's marker names (the session's unless the marker sets
        llama.cpp keys such as ``threads`` or ``flash_attn``; loaded on first use)."""
        return self._engine_for(self._marker)

    def _engine_for(self, config: MarkerConfig) -> Engine:
        with _one_line():
            return self._engine_factory(dict(config.engine)) if config.engine else self._engine_factory()

    def _subject(self, engine: Subject | None, config: MarkerConfig) -> Subject:
        if engine is None:
            return self._engine_for(config)
        if config.engine:
            raise pytest.fail.Exception(
                f"llama.cpp settings ({', '.join(config.engine)}) apply to the plugin's engine, not to the "
                "engine passed to measure(); drop one of them",
                pytrace=False,
            )
        return engine

    @property
    def measurements(self) -> list[Measurement]:
        return [r.measurement for r in self.results]

    def measure(self, engine: Subject | None = None, *, label: str = "", **overrides: Any) -> Measurement:
        from ..judge.budgets import check_budgets  # numpy and scipy: once a test measures
        from ..measuring.runner import measure

        call = f"llmperf.measure(label={label!r}): label" if label else "llmperf.measure(): its automatic label"
        if not label and self.results:
            label = f"#{len(self.results) + 1}"  # the measurement's number in the test
        if label in {r.measurement.label for r in self.results}:  # one baseline key each: never overwrite
            raise pytest.fail.Exception(
                f"{call} {label!r} is taken by an earlier measurement of this test; "
                "give each measurement of a test a distinct label",
                pytrace=False,
            )
        with _one_line():
            config = self._marker.merged(overrides)
            if self._smoke:
                return self._smoke_measure(engine, config, label)
            workload = Workload(**config.workload)
            subject = self._subject(engine, config)
            if self._side is not None:
                return self._driven(subject, config, label)
            measurement = measure(
                subject, workload, label=label, slo=config.budgets, **self._measure_options(subject, config)
            )
        load = measurement.load
        if load is not None and load.n_failed:
            # Shown in the report, but never assessed: no baseline from a broken measurement.
            failure = check_budgets(measurement, config.budgets)
            self.results.append(Result(measurement, failure, len(config.budgets)))
            prefix = f"[{label}] " if label else ""
            pytest.fail(
                f"{prefix}{load.n_failed} of {load.n_requests} requests failed; {load.errors[0]}", pytrace=False
            )
        kind = _model_load(config)
        if kind is not None:  # fresh loads, after the runs and before the baseline sees the record
            from ..measuring.runner import with_model_loads

            with _one_line():
                measurement = with_model_loads(subject, measurement, kind, self._release)
                again = subject if engine is not None else self._subject(None, config)
                if again is not subject:  # the pool's engine again (a cold load closed it): warm it as measure() did
                    from ..measuring.runner import as_engine

                    for i in range(workload.warmup):
                        as_engine(again).run(workload, -1 - i)
                subject = again
        measurement, assessment = self._sequential(subject, measurement, config)
        return self._keep(measurement, config, assessment)

    def compare(self, a: Any = None, b: Any = None, *, label: str = "", **keys: Any) -> ABResult:
        """Run A and B interleaved (``runs`` pairs in seeded AB/BA order, warm-ups for both) and
        compare them with paired statistics (``ab.ABResult``). A side: llama.cpp settings
        (``{"threads": 1}``, over the session's), a model (path or preset), a callable
        ``fn(prompt, max_tokens)``, an endpoint URL or an engine. ``max_slowdown`` /
        ``min_speedup`` (a number for both phases, or per phase/metric) fail the test when
        the whole CI lies beyond them; ``min_top1_agreement``, ``max_kl``, ``max_kl_p99`` bound
        the sides' output agreement (``r.agreement``, computed after the runs). Other keywords
        are marker keys (workload)."""
        from ..core.catalog import AGREEMENT_BUDGETS
        from ..judge.ab import compare_ab
        from .marks import resolve_side

        if a is not None:
            keys["a"] = a
        if b is not None:
            keys["b"] = b
        with _one_line():
            config = self._marker.merged(keys)
            if not config.is_ab:
                raise LLMPerfError("llmperf.compare() needs both sides: a=... and b=...")
            workload = dict(config.workload)
            if self._smoke:
                workload.update(runs=3, warmup=0)  # the fewest pairs with a CI

            def engine_for(settings: Mapping[str, Any]) -> Any:
                merged = {**config.engine, **settings}  # the marker's settings under each side's
                return self._engine_factory(merged) if merged else self._engine_factory()

            side_a, side_b = (resolve_side(name, config.ab[name], engine_for) for name in ("a", "b"))
            turn = self._side.turn() if self._side is not None else contextlib.nullcontext()
            with turn:  # a side of --llmperf-against: while the other side waits
                result = compare_ab(
                    side_a,
                    side_b,
                    Workload(**workload),
                    max_slowdown=None if self._smoke else config.ab.get("max_slowdown"),
                    min_speedup=None if self._smoke else config.ab.get("min_speedup"),
                    label=label,
                    agreement=not self._smoke,
                    **{k: None if self._smoke else config.ab.get(k) for k in AGREEMENT_BUDGETS},
                )
        self.ab_results.append(result)
        return result

    def _keep(
        self, measurement: Measurement, config: MarkerConfig, assessment: Assessment | None, against: bool = False
    ) -> Measurement:
        """The test's result of one measurement: its budgets checked, its verdict; ``against``
        (judged against ``--llmperf-against``'s REF): the marker's agreement budgets too."""
        from ..judge.budgets import against_agreement, check_budgets, undecided_budgets

        also, n_agreement = against_agreement(measurement, config.ab) if against else ((), 0)
        self.results.append(
            Result(
                measurement,
                check_budgets(measurement, config.budgets, also),
                len(config.budgets) + n_agreement,
                assessment,
                dict(config.budgets),
                budget_notes=tuple(b.line() for b in undecided_budgets(measurement, config.budgets)),
            )
        )
        return measurement

    def _driven(self, subject: Subject, config: MarkerConfig, label: str) -> Measurement:
        """On a side of ``--llmperf-against``: the runs the controller asks for, its verdict."""
        assert self._side is not None  # measure() drives only on a side
        measurement, assessment = self._side.measure(subject, config, label, self._nodeid)
        kind = _model_load(config)
        if kind is not None:  # each side's own fresh loads, after the pairs: its budgets see them
            from ..measuring.runner import with_model_loads

            with _one_line():
                measurement = with_model_loads(subject, measurement, kind, self._release)
        # Judged against REF on this tree's side only (REF's side gets no verdict: no assessment).
        return self._keep(measurement, config, assessment, against=assessment is not None)

    def _sequential(
        self, subject: Subject, m: Measurement, config: MarkerConfig
    ) -> tuple[Measurement, Assessment | None]:
        """Assess; while the baseline comparison is INCONCLUSIVE or a budget's CI straddles its
        limit, measure ``runs`` more, up to ``max_runs`` or ``SEQUENTIAL_TIME_CAP_S``. Every look
        tests at alpha / looks (``CompareSettings.looks``), so stopping early keeps the error rate."""
        from ..judge.budgets import budgets_worth_more_runs
        from ..measuring.runner import extend

        step = m.workload.runs
        max_runs = int(config.options.get("max_runs", SEQUENTIAL_FACTOR * step))
        looks = max(1, -(-max(max_runs, step) // step)) if m.load is None else 1
        config = dataclasses.replace(config, settings={**config.settings, "looks": looks})
        assessment = self._assess(m, config)
        started = time.monotonic()
        with _one_line():
            while (
                looks > 1
                and (_undecided(assessment) or budgets_worth_more_runs(m, config.budgets))
                and m.n_runs < max_runs
                and time.monotonic() - started < SEQUENTIAL_TIME_CAP_S
            ):
                m = extend(subject, m, min(step, max_runs - m.n_runs))
                assessment = self._assess(m, config)
        return m, assessment

    def _smoke_measure(self, engine: Subject | None, config: MarkerConfig, label: str) -> Measurement:
        """Once, with no warm-up; a load workload sends one request per slot. Recorded with no
        budgets and no assessment: one run is no statistic."""
        from ..measuring.runner import measure

        workload = {**config.workload, **SMOKE}
        if "requests" in workload or "concurrency" in workload or "rate" in workload:
            workload["requests"] = workload.get("concurrency", 1)
        subject = self._subject(engine, config)
        measurement = measure(subject, Workload(**workload), label=label)
        self.results.append(Result(measurement, None, 0))
        return measurement
