"""A measurement as the bottom layer sees it: its shape and its headline figures.

``measuring.metrics.Measurement`` (and what it holds: runs, pooled ITL, a load test's stats,
the roofline, peak RSS, fresh loads, the agreement with REF) is built above ``core/``, but the
metric catalog's readers read it. ``MeasurementShape`` and the shapes under it name the fields
they read, as read-only ``Protocol`` members, so the readers are typed
``Callable[[MeasurementShape], float | None]`` and mypy checks, wherever a ``Measurement`` is
handed to one, that it has them; the behaviour (how the figures are computed) stays in
``measuring/``.

``Figures`` is the data read from it: one field per ``catalog.FIGURES`` entry, in its order,
of the Python type of its JSON type (``Figure.json``; or None too when the session schema does
not require it: an older session file may lack it). tests/test_catalog.py derives the fields
from the catalog and the schema and checks this declaration against them, so a figure added to
the catalog alone fails that test, which names the field to add."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .catalog import FIGURES
from .workload import EngineInfo


class RunShape(Protocol):
    """One run (``measuring.metrics.RunMetrics``): its per-run fields the catalog reads
    (``Metric.run_field``)."""

    @property
    def ttft_ms(self) -> float: ...

    @property
    def prefill_tps(self) -> float | None: ...

    @property
    def tpot_ms(self) -> float: ...

    @property
    def decode_tps(self) -> float: ...

    @property
    def itl_p50_ms(self) -> float: ...

    @property
    def itl_p95_ms(self) -> float: ...

    @property
    def delivered_ttft_ms(self) -> float | None: ...


class LatencyShape(Protocol):
    """A distribution of latencies (``measuring.metrics.LatencyStats``)."""

    @property
    def count(self) -> int: ...

    @property
    def cv(self) -> float: ...

    @property
    def p50_ms(self) -> float: ...

    @property
    def p90_ms(self) -> float: ...

    @property
    def p95_ms(self) -> float: ...

    @property
    def p99_ms(self) -> float: ...


class LoadShape(Protocol):
    """A load test's figures (``measuring.served.LoadStats``)."""

    @property
    def concurrency(self) -> int: ...

    @property
    def n_requests(self) -> int: ...

    @property
    def n_failed(self) -> int: ...

    @property
    def requests_per_s(self) -> float: ...

    @property
    def output_tps(self) -> float: ...

    @property
    def goodput(self) -> float | None: ...


class PhaseRooflineShape(Protocol):
    """One phase of the roofline (``measuring.roofline.PhaseRoofline``)."""

    @property
    def mbu(self) -> float: ...


class RooflineShape(Protocol):
    """The roofline (``measuring.roofline.Roofline``): its decode phase."""

    @property
    def decode(self) -> PhaseRooflineShape: ...


class PeakRssShape(Protocol):
    """Peak resident memory (``measuring.runner.PeakRss``)."""

    @property
    def bytes(self) -> int: ...

    @property
    def scope(self) -> str: ...  # "measurement" (peak reset before it) or "process"


class ModelLoadsShape(Protocol):
    """The test's fresh model loads (``measuring.runner.ModelLoads``)."""

    @property
    def samples(self) -> Sequence[object]: ...

    @property
    def page_cache(self) -> str: ...

    @property
    def load_ms(self) -> float: ...

    @property
    def fresh_ttft_ms(self) -> float | None: ...


class AgreementShape(Protocol):
    """The output agreement with REF (``measuring.agreement.Agreement``)."""

    @property
    def available(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def method(self) -> str: ...

    @property
    def sample(self) -> str: ...

    @property
    def n_positions(self) -> int: ...

    @property
    def top1_agreement(self) -> float | None: ...

    @property
    def kl_mean(self) -> float | None: ...

    @property
    def kl_p99(self) -> float | None: ...

    @property
    def greedy_parity(self) -> float | None: ...


class MeasurementShape(Protocol):
    """What the catalog's readers and ``Figures.of`` read of a ``measuring.metrics.Measurement``."""

    @property
    def engine(self) -> EngineInfo: ...

    @property
    def runs(self) -> Sequence[RunShape]: ...

    @property
    def n_runs(self) -> int: ...

    @property
    def itl(self) -> LatencyShape: ...

    @property
    def prompt_tokens(self) -> int | None: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def ttft_ms(self) -> float: ...

    @property
    def prefill_ms(self) -> float | None: ...

    @property
    def prefill_tps(self) -> float | None: ...

    @property
    def tpot_ms(self) -> float: ...

    @property
    def decode_tps(self) -> float: ...

    @property
    def e2e_ms(self) -> float: ...

    @property
    def native_prefill_ms(self) -> float | None: ...

    @property
    def native_decode_ms_per_token(self) -> float | None: ...

    @property
    def overhead_ms_per_token(self) -> float | None: ...

    @property
    def tokenize_ms(self) -> float: ...

    @property
    def sampling_ms_per_token(self) -> float | None: ...

    @property
    def prefill_outside_ms(self) -> float | None: ...

    @property
    def decode_outside_ms_per_token(self) -> float | None: ...

    @property
    def python_sampling_ms_per_token(self) -> float | None: ...

    @property
    def delivered_ttft_ms(self) -> float | None: ...

    @property
    def load(self) -> LoadShape | None: ...

    @property
    def roofline(self) -> RooflineShape | None: ...

    @property
    def peak_rss(self) -> PeakRssShape | None: ...

    @property
    def model_loads(self) -> ModelLoadsShape | None: ...

    @property
    def agreement(self) -> AgreementShape | None: ...


@dataclass(frozen=True)
class LoadFigures:
    """A load test's headline figures (``measuring.served.LoadStats``)."""

    concurrency: int
    requests: int
    failed_requests: int
    requests_per_s: float
    output_tps: float
    goodput: float | None

    @classmethod
    def of(cls, load: LoadShape) -> LoadFigures:
        return cls(load.concurrency, load.n_requests, load.n_failed, load.requests_per_s, load.output_tps, load.goodput)


@dataclass(frozen=True)
class Figures:
    """A measurement's headline figures: one field per ``catalog.FIGURES`` entry (module
    docstring), unrounded, as the JUnit properties and the terminal summary show them (the
    record's ``summary`` is the rounded subset kept in files), then ``load``."""

    model: str
    engine: str
    prompt_tokens: int | None
    output_tokens: int
    runs: int
    ttft_ms: float
    ttft_p95_ms: float
    prefill_ms: float | None
    prefill_tps: float | None
    tpot_ms: float
    tpot_p99_ms: float | None
    decode_tps: float
    e2e_ms: float
    delivered_ttft_ms: float | None
    itl_count: int
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p95_ms: float
    itl_p99_ms: float
    itl_cv: float
    native_prefill_ms: float | None
    native_decode_ms_per_token: float | None
    overhead_ms_per_token: float | None
    rss_mib: float | None
    kv_mib: float | None
    compute_mib: float | None
    model_buffer_mib: float | None
    mapped_mib: float | None
    load_ms: float | None
    load_page_cache: str | None
    load_samples: int | None
    fresh_ttft_ms: float | None
    top1_agreement: float | None
    kl_mean: float | None
    kl_p99: float | None
    greedy_parity: float | None
    agreement_positions: int | None
    agreement: str | None
    load: LoadFigures | None = None

    @classmethod
    def of(cls, m: MeasurementShape) -> Figures:
        """From a ``measuring.metrics.Measurement``, each figure read as the catalog says."""
        figures: dict[str, Any] = {name: f.read(m) for name, f in FIGURES.items()}
        return cls(**figures, load=None if m.load is None else LoadFigures.of(m.load))

    def values(self) -> dict[str, Any]:
        """Flat name -> value of every figure but ``load``, in the catalog's order."""
        return {name: getattr(self, name) for name in FIGURES}

    def to_json(self) -> dict[str, Any]:
        return {**self.values(), "load": None if self.load is None else dataclasses.asdict(self.load)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Figures:
        """A figure a session file of an older pytest-llmperf lacks (added to the catalog since)
        reads as None."""
        load = d.get("load")
        figures: dict[str, Any] = {k: d.get(k) for k in FIGURES}
        if load is None:
            return cls(**figures)
        return cls(**figures, load=LoadFigures(**{f.name: load[f.name] for f in dataclasses.fields(LoadFigures)}))
