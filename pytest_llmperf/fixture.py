"""The ``llmperf`` fixture object: measures the marker's workload for one test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

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
    ) -> None:
        self._marker = marker
        self._engine_factory = engine_factory
        self._assess = assess
        self.results: list[Result] = []

    @property
    def engine(self) -> "LlamaCppEngine":
        """The session's llama.cpp engine (loaded on first use)."""
        try:
            return self._engine_factory()
        except LLMPerfError as exc:
            pytest.fail(str(exc), pytrace=False)

    @property
    def measurements(self) -> list[Measurement]:
        return [r.measurement for r in self.results]

    def measure(self, engine: Any = None, *, label: str = "", **overrides: Any) -> Measurement:
        if not label and self.results:
            label = f"#{len(self.results) + 1}"
        try:
            config = self._marker.merged(overrides)
            workload = Workload(**config.workload)
            measurement = measure(self.engine if engine is None else engine, workload, label=label)
        except LLMPerfError as exc:
            pytest.fail(str(exc), pytrace=False)
        self.results.append(
            Result(
                measurement,
                check_budgets(measurement, config.budgets),
                len(config.budgets),
                self._assess(measurement, config),
            )
        )
        return measurement
