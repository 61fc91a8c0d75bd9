"""A measurement's headline figures.

``Figures`` is the data the metric catalog reads from a ``core.measurement.Measurement``: one
field per ``catalog.FIGURES`` entry, in its order, of the Python type of its JSON type (``Figure.json``; or None too when the session schema does
not require it: an older session file may lack it). tests/test_catalog.py derives the fields
from the catalog and the schema and checks this declaration against them, so a figure added to
the catalog alone fails that test, which names the field to add."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .catalog import FIGURES
from .documents import JSONValue
from .measurement import LoadStats, Measurement


@dataclass(frozen=True)
class LoadFigures:
    """A load test's headline figures (``LoadStats``)."""

    concurrency: int
    requests: int
    failed_requests: int
    requests_per_s: float
    output_tps: float
    goodput: float | None

    @classmethod
    def of(cls, load: LoadStats) -> LoadFigures:
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
    def of(cls, m: Measurement) -> Figures:
        """From a ``Measurement``, each figure read as the catalog says (the fields are in its order)."""
        load = None if m.load is None else LoadFigures.of(m.load)
        figures: list[Any] = [*(f.read(m) for f in FIGURES.values()), load]  # each of its field's type
        return cls(*figures)

    def values(self) -> dict[str, Any]:
        """Flat name -> value of every figure but ``load``, in the catalog's order."""
        return {name: getattr(self, name) for name in FIGURES}

    def to_json(self) -> dict[str, JSONValue]:
        return {**self.values(), "load": None if self.load is None else dataclasses.asdict(self.load)}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Figures:
        """A figure a session file of an older pytest-llmperf lacks (added to the catalog since)
        reads as None."""
        load = d.get("load")
        figures: dict[str, Any] = {k: d.get(k) for k in FIGURES}
        if not isinstance(load, Mapping):
            return cls(**figures)
        return cls(**figures, load=LoadFigures(**{f.name: load[f.name] for f in dataclasses.fields(LoadFigures)}))
