"""The ``llmperf`` fixture object: measures the marker's workload for one test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import pytest

from .budgets import BudgetFailure, check_budgets
from .errors import LLMPerfError
from .metrics import Measurement
from .runner import measure
from .schema import MarkerConfig
from .workload import Workload

if TYPE_CHECKING:
    from .engines.llama_cpp import LlamaCppEngine


@dataclass(frozen=True)
class Result:
    measurement: Measurement
    failure: BudgetFailure | None
    n_budgets: int
    baseline: Any = None  # what the plugin's ``assess`` returned (baseline comparison)
    budgets: Mapping[str, float] = field(default_factory=dict)  # the marker's, drawn as lines in the HTML report


class LLMPerf:
    """Bound to one test: ``measure()`` runs the workload and records it for the report.

    Keyword arguments to ``measure`` are marker keys and override the marker for that call;
    ``engine`` may be any Engine or a callable ``fn(prompt, max_tokens)`` yielding tokens.
    """

    def __init__(
        self,
        marker: MarkerConfig,
        engine_factory: Callable[[], "LlamaCppEngine"],
        assess: Callable[[Measurement, MarkerConfig], Any] = lambda m, c: None,
        measure_options: Callable[[Any, MarkerConfig], Mapping[str, Any]] = lambda engine, c: {},
    ) -> None:
        self._marker = marker
        self._measure_options = measure_options
        self._engine_factory = engine_factory
        self._assess = assess
        self.results: list[Result] = []

    @property
    def engine(self) -> "LlamaCppEngine":
        """The session's llama.cpp engine (loaded on first use)."""
        try:
            return self._engine_factory()
        except LLMPerfError as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy

    @property
    def measurements(self) -> list[Measurement]:
        return [r.measurement for r in self.results]

    def measure(self, engine: Any = None, *, label: str = "", **overrides: Any) -> Measurement:
        if not label and self.results:
            label = f"#{len(self.results) + 1}"
        try:
            config = self._marker.merged(overrides)
            workload = Workload(**config.workload)
            subject = self.engine if engine is None else engine
            measurement = measure(
                subject, workload, label=label, slo=config.budgets, **self._measure_options(subject, config)
            )
        except LLMPerfError as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy
        load = measurement.load
        if load is not None and load.n_failed:
            # Shown in the report, but never assessed: no baseline from a broken measurement.
            failure = check_budgets(measurement, config.budgets)
            self.results.append(Result(measurement, failure, len(config.budgets)))
            prefix = f"[{label}] " if label else ""
            pytest.fail(f"{prefix}{load.n_failed} of {load.n_requests} requests failed; {load.errors[0]}", pytrace=False)
        self.results.append(
            Result(
                measurement,
                check_budgets(measurement, config.budgets),
                len(config.budgets),
                self._assess(measurement, config),
                dict(config.budgets),
            )
        )
        return measurement
