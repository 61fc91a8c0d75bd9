"""One test's measurements, from its marker to what its report carries.

``Measurer`` owns a measurement's life (pyperf's Runner owns a benchmark's the same way): the
label, smoke mode, the runs, a load test's failed requests, fresh model loads, the sequential
looks, the baseline assessment and the budgets, ending in one ``judge.result.Outcome`` (built
by ``judge.result.outcome``; what a ``pytest_llmperf_result`` hook sees, the live measurement
and its budget breaches with it); ``reports.session_file.call_report`` turns a test's outcomes
into its report parts.

Light: the pytest plugin imports it at every start; numpy, scipy and the runner are imported
inside the methods that measure."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.catalog import AGREEMENT_BUDGETS
from ..core.errors import ConfigError, LLMPerfError
from ..core.progress import current, task
from ..core.redact import display
from ..core.workload import SEQUENTIAL_FACTOR, SEQUENTIAL_TIME_CAP_S, Workload
from ..engines import CallableEngine, SteppedCallableEngine, is_token_stream
from ..engines.capabilities import Engine
from .options import check_side

if TYPE_CHECKING:
    from ..core.measurement import Measurement
    from ..engines import CounterSource, TokenStream
    from ..judge.ab import ABResult, Side
    from ..judge.budgets import BudgetFailure
    from ..judge.result import Outcome
    from .assess import MeasureOptions
    from .options import MarkerConfig
    from .sides import Link

    #: What ``measure()`` takes as an engine: any Engine, or ``fn(prompt, max_tokens)``.
    Subject = Engine | TokenStream


#: Workload keys ``--llmperf-disable`` overrides: one run, no warm-up (a smoke test).
SMOKE = {"runs": 1, "warmup": 0}


def _model_load(config: MarkerConfig) -> str | None:
    """The fresh loads a test asks for: its ``model_load`` key, or warm ones for a ``max_load_ms``."""
    kind = config.options.get("model_load", "warm" if "max_load_ms" in config.budgets else None)
    return None if kind is None else str(kind)


def _undecided(assessment: Outcome | None) -> bool:
    """More runs may decide the baseline comparison: it is undecided, and the machine was not
    busier than at baseline (a busy machine's runs measure its neighbours: more of them cannot
    decide anything about the subject)."""
    from ..judge.verdict import BaselineStatus

    verdict = None if assessment is None else assessment.verdict
    if verdict is None or verdict.status != BaselineStatus.COMPARED or verdict.machine:
        return False
    return any(c.worth_more_runs for c in verdict.comparisons)


class Measurer:
    """One test's measurements (one attempt of it): ``measure()`` takes the marker (and a
    call's overrides: marker keys) to one ``Outcome``, kept in ``results``.

    ``engine_for(settings)``: the engine for llama.cpp settings over the session's (none: the
    session's own); ``assess(measurement, marker)``: the baseline assessment (None: none);
    ``measure_options(engine, marker)``: what to measure besides the runs (``runner.measure``'s
    keywords); ``smoke`` (``--llmperf-disable``): one run each, no budgets, no assessment;
    ``side``: a side of ``--llmperf-against``, where the controller drives the runs;
    ``release(path)``: closes the engines that map a model file (before cold loads);
    ``counters()``: the llama.cpp counters of the Llama the fixtures handed out, read around
    each run of a measured callable (``engines.CallableEngine``; None: none handed out);
    ``prompt_cache``: the session's ``--llmperf-prompt-cache`` for measured callables (a marker's
    ``prompt_cache`` wins); ``test_id``: its full id (default ``nodeid``); ``fit_handed(workload)``:
    the Llama the fixtures handed out made ready for a callable's workload before it runs (its
    context fitted to every request, or one line). Every error is one ``LLMPerfError`` line."""

    def __init__(
        self,
        marker: MarkerConfig,
        engine_for: Callable[..., Engine],
        assess: Callable[[Measurement, MarkerConfig], Outcome | None] = lambda m, c: None,
        measure_options: Callable[[Subject, MarkerConfig], MeasureOptions] = lambda engine, c: {},
        *,
        smoke: bool = False,
        side: Link | None = None,
        nodeid: str = "",
        release: Callable[[str], None] = lambda path: None,
        counters: Callable[[], CounterSource[Any] | None] = lambda: None,
        prompt_cache: str = "cold",
        test_id: str = "",
        seen: Callable[[object], None] = lambda engine: None,
        fit_handed: Callable[[Workload], None] = lambda workload: None,
    ) -> None:
        self.fit_handed = fit_handed
        self.marker = marker
        self.seen = seen
        self.prompt_cache = prompt_cache
        self.engine_for = engine_for
        self.assess = assess
        self.measure_options = measure_options
        self.smoke = smoke
        self.side = side
        self.nodeid = nodeid
        self.test_id = test_id or nodeid
        self.release = release
        self.counters = counters
        self.results: list[Outcome] = []
        self.ab_results: list[ABResult] = []  # of each compare()

    def engine(self, config: MarkerConfig | None = None) -> Engine:
        """The llama.cpp engine ``config`` (default: the marker) names: the session's unless it
        sets llama.cpp keys such as ``threads`` or ``flash_attn`` (loaded on first use)."""
        config = self.marker if config is None else config
        return self.engine_for(dict(config.engine)) if config.engine else self.engine_for()

    def subject(self, engine: Subject | None, config: MarkerConfig) -> Engine:
        """What a measurement runs: ``engine`` as given (a callable: ``counted``), else the
        marker's; told to ``seen`` (the session keeps the engines its tests sent requests with)."""
        if engine is None:
            chosen = self.engine(config)
        elif config.engine:
            raise ConfigError(
                f"llama.cpp settings ({', '.join(config.engine)}) apply to the plugin's engine, not to the "
                "engine passed to measure(); drop one of them"
            )
        else:
            chosen = self.counted(engine, Workload(**config.workload))
        self.seen(chosen)
        return chosen

    def counted(self, subject: Subject, workload: Workload) -> Engine:
        """An engine as is; a callable ``fn(prompt, max_tokens)`` as a ``CallableEngine`` that
        watches every ``llama_cpp.Llama`` of the process around each run (``LlamaWatch``: cleared,
        counted, its tokens stamped where made) and pauses token by token with the Llama the
        fixtures handed out (``counters``), that Llama first made ready for ``workload``
        (``fit_handed``)."""
        if isinstance(subject, Engine):
            return subject
        self.fit_handed(workload)
        from ..engines.llama_cpp import LlamaCounters
        from ..engines.user_llama import watch_llamas

        watch = watch_llamas()
        counters = self.counters()
        if watch is not None and isinstance(counters, LlamaCounters) and counters.info is not None:
            watch.know(counters.llm, counters.info)
        if counters is None:
            return CallableEngine(subject, watch=watch)
        return SteppedCallableEngine(subject, counters=counters, watch=watch)

    def measure(self, engine: Subject | None = None, *, label: str = "", **overrides: object) -> Outcome:
        """One measurement of ``engine`` (default: the marker's), its budgets and verdict; kept
        in ``results`` (a load test with failed requests too, before its error is raised)."""
        label = self._label(label)
        config = self.marker.merged(overrides)
        if self.smoke:
            return self._smoke(engine, config, label)
        with task(self.nodeid + (f"[{label}]" if label else "")):  # its waits said on one line (core.progress)
            return self._measured(engine, config, label)

    def _measured(self, engine: Subject | None, config: MarkerConfig, label: str) -> Outcome:
        progress = current()
        progress.step("its engine")  # loaded on first use
        workload = Workload(**config.workload)
        subject = self.subject(engine, config)
        progress.step("measuring")
        if engine is not None and not isinstance(engine, Engine) and "prompt_cache" not in config.workload:
            workload = dataclasses.replace(workload, prompt_cache=self.prompt_cache)
        if self.side is not None:
            if workload.conversation is not None:
                raise ConfigError("--llmperf-against pairs single requests: a conversation is not supported there yet")
            return self._driven(subject, config, label)
        from ..measuring.runner import measure

        m = measure(subject, workload, label=label, slo=config.budgets, **self.measure_options(subject, config))
        self._check_load(m, config)
        kind = _model_load(config)
        if kind is not None:  # fresh loads, after the runs and before the baseline sees the record
            m = self._with_loads(subject, m, kind)
            if engine is None:  # the pool's engine again (a cold load closed it)
                progress.step("its engine again, warmed up")
                subject = self._warm_again(subject, config, workload)
        progress.step("judging")
        return self._judged(subject, m, config)

    def compare(self, a: object = None, b: object = None, *, label: str = "", **keys: object) -> ABResult:
        """Run A and B interleaved (``runs`` pairs in seeded AB/BA order, warm-ups for both) and
        compare them with paired statistics (``ab.ABResult``). A side: llama.cpp settings
        (``{"threads": 1}``, over the session's), a model (path or preset), a callable
        ``fn(prompt, max_tokens)``, an endpoint URL or an engine. ``max_slowdown`` /
        ``min_speedup`` (a number for both phases, or per phase/metric) fail the test when
        the whole CI lies beyond them; ``min_top1_agreement``, ``max_kl``, ``max_kl_p99`` bound
        the sides' output agreement (``r.agreement``, computed after the runs). Other keywords
        are marker keys (workload). Kept in ``ab_results``."""
        from ..judge.ab import compare_ab

        keys.update({name: side for name, side in (("a", a), ("b", b)) if side is not None})
        config = self.marker.merged(keys)
        if not config.is_ab:
            raise LLMPerfError("llmperf.compare() needs both sides: a=... and b=...")
        workload = dict(config.workload)
        if self.smoke:
            workload.update(runs=3, warmup=0)  # the fewest pairs with a CI

        def engine_for(settings: Mapping[str, object]) -> Engine:
            merged = {**config.engine, **settings}  # the marker's settings under each side's
            return self.engine_for(merged) if merged else self.engine_for()

        side_a, side_b = (
            dataclasses.replace(side, engine=self.counted(side.engine, Workload(**workload)))
            for side in (resolve_side(name, config.ab[name], engine_for) for name in ("a", "b"))
        )
        self.seen(side_a.engine)
        self.seen(side_b.engine)
        # The attribution pass: the marker's key or the session's option (``measure_options``).
        # In smoke mode never (three pairs decide nothing, so nothing moved either).
        asked = None if self.smoke else bool(self.measure_options(side_a.engine, config).get("attribution"))
        turn = self.side.turn() if self.side is not None else contextlib.nullcontext()
        with turn, task(f"{self.nodeid}: A/B" + (f"[{label}]" if label else "")):  # a side: while the other waits
            result = compare_ab(
                side_a, side_b, Workload(**workload), label=label, attribution=asked, **self._ab_budgets(config)
            )
        self.ab_results.append(result)
        return result

    def _ab_budgets(self, config: MarkerConfig) -> dict[str, Any]:
        """An A/B's relative and agreement budgets, and whether its agreement is computed (in smoke
        mode neither: three pairs decide nothing)."""
        keys = ("max_slowdown", "min_speedup", *AGREEMENT_BUDGETS)
        return {"agreement": not self.smoke, **{k: None if self.smoke else config.ab.get(k) for k in keys}}

    def _label(self, label: str) -> str:
        """The measurement's label: ``label``, or its number in the test after the first; a label
        is one baseline key, never taken twice."""
        call = f"llmperf.measure(label={label!r}): label" if label else "llmperf.measure(): its automatic label"
        if not label and self.results:
            label = f"#{len(self.results) + 1}"
        if label in {r.label for r in self.results}:
            raise ConfigError(
                f"{call} {label!r} is taken by an earlier measurement of this test; "
                "give each measurement of a test a distinct label"
            )
        return label

    def _check_load(self, m: Measurement, config: MarkerConfig) -> None:
        """A load test whose requests failed: shown in the report, but never assessed (no
        baseline from a broken measurement), and the test fails."""
        load = m.load
        if load is None or not load.n_failed:
            return
        from ..judge.budgets import check_budgets

        self._keep(m, check_budgets(m, config.budgets), len(config.budgets))
        prefix = f"[{m.label}] " if m.label else ""
        raise LLMPerfError(f"{prefix}{load.n_failed} of {load.n_requests} requests failed; {load.errors[0]}")

    def _with_loads(self, subject: Subject, m: Measurement, kind: str) -> Measurement:
        from ..measuring.runner import with_model_loads

        return with_model_loads(subject, m, kind, self.release)

    def _warm_again(self, subject: Engine, config: MarkerConfig, workload: Workload) -> Engine:
        """The marker's engine after fresh loads: a cold load closed the pool's, so a new one is
        warmed as ``measure()`` did before its looks go on."""
        again = self.subject(None, config)
        if again is not subject:
            for i in range(workload.warmup):
                again.run(workload, -1 - i)
        return again

    def _judged(self, subject: Subject, m: Measurement, config: MarkerConfig) -> Outcome:
        """Assess; while the baseline comparison is INCONCLUSIVE or a budget's CI straddles its
        limit, measure ``runs`` more, up to ``max_runs`` or ``SEQUENTIAL_TIME_CAP_S``. Every look
        tests at alpha / looks (``CompareSettings.looks``), so stopping early keeps the error rate."""
        from ..judge.budgets import budgets_worth_more_runs
        from ..measuring.runner import extend

        step = m.asked.runs
        max_runs = int(config.options.get("max_runs", SEQUENTIAL_FACTOR * step))
        looks = max(1, -(-max(max_runs, step) // step)) if m.load is None else 1
        config = dataclasses.replace(config, settings={**config.settings, "looks": looks})
        assessment = self.assess(m, config)
        started = time.monotonic()
        while (
            looks > 1
            and (_undecided(assessment) or budgets_worth_more_runs(m, config.budgets))
            and m.n_runs < max_runs
            and time.monotonic() - started < SEQUENTIAL_TIME_CAP_S
        ):
            m = extend(subject, m, min(step, max_runs - m.n_runs))
            assessment = self.assess(m, config)
        return self._kept(m, config, assessment)

    def _kept(self, m: Measurement, config: MarkerConfig, assessment: Outcome | None, against: bool = False) -> Outcome:
        """The test's outcome of one measurement: its budgets checked, its verdict; ``against``
        (judged against ``--llmperf-against``'s REF): the marker's agreement budgets too."""
        from ..judge.budgets import against_agreement, check_budgets, undecided_budgets

        also, n_agreement = against_agreement(m, config.ab) if against else ((), 0)
        failure = check_budgets(m, config.budgets, also)
        notes = tuple(b.line() for b in undecided_budgets(m, config.budgets))
        n = len(config.budgets) + n_agreement
        return self._keep(m, failure, n, config.budgets, notes, assessment)

    def _keep(
        self,
        m: Measurement,
        failure: BudgetFailure | None,
        n: int,
        budgets: Mapping[str, float] | None = None,
        notes: tuple[str, ...] = (),
        judged: Outcome | None = None,
    ) -> Outcome:
        """``m``'s outcome (``judge.result.outcome``), kept in ``results``."""
        from ..judge.result import outcome

        self.results.append(
            outcome(m, self.test_id, self.nodeid, failure, n, budgets=budgets, budget_notes=notes, judged=judged)
        )
        return self.results[-1]

    def _driven(self, subject: Subject, config: MarkerConfig, label: str) -> Outcome:
        """On a side of ``--llmperf-against``: the runs the controller asks for, its verdict."""
        assert self.side is not None  # measure() drives only on a side
        asked = bool(self.measure_options(subject, config).get("attribution"))
        m, assessment = self.side.measure(subject, config, label, self.nodeid, attribution=asked)
        kind = _model_load(config)
        if kind is not None:  # each side's own fresh loads, after the pairs: its budgets see them
            m = self._with_loads(subject, m, kind)
        # Judged against REF on this tree's side only (REF's side gets no verdict: no assessment).
        return self._kept(m, config, assessment, against=assessment is not None)

    def _smoke(self, engine: Subject | None, config: MarkerConfig, label: str) -> Outcome:
        """Once, with no warm-up; a load workload sends one request per slot. Recorded with no
        budgets and no assessment: one run is no statistic."""
        from ..measuring.runner import measure

        workload = {**config.workload, **SMOKE}
        if "requests" in workload or "concurrency" in workload or "rate" in workload:
            workload["requests"] = workload.get("concurrency", 1)
        subject = self.subject(engine, config)
        return self._keep(measure(subject, Workload(**workload), label=label), None, 0)


def resolve_side(name: str, spec: object, engine_for: Callable[[Mapping[str, object]], Engine]) -> Side:
    """What a side of an A/B may be (llama.cpp settings, a model, a callable, an endpoint, an
    engine), as a ``Side`` ready to run; ``engine_for(settings)``: the session's (or the
    caller's) engine for llama.cpp settings over the session's."""
    from ..engines.http import HttpEngine  # asyncio only for an endpoint's side
    from ..judge.ab import Side  # numpy and scipy only once a test compares two sides

    spec = check_side(name, spec)
    if isinstance(spec, Mapping):
        label = " ".join(f"{k}={v}" for k, v in spec.items()) or "session engine"
        return Side(label, engine_for(spec))
    if isinstance(spec, str):
        if spec.startswith(("http://", "https://")):
            return Side(display(spec), HttpEngine(spec))  # named as shown: no password, no api_key=
        return Side(spec, engine_for({"model": spec}))
    if isinstance(spec, Engine):
        return Side(spec.info().model, spec)
    if not is_token_stream(spec):  # check_side let through nothing else
        raise TypeError(f"A/B side {name!r}: {spec!r} is no side")
    return Side(getattr(spec, "__name__", repr(spec)), spec)
