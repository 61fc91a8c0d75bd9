"""The Measurement is the one record of a measurement (issue 48): ``to_json`` writes what a
baseline or session file holds, ``read`` / ``from_json`` give back a Measurement, and a
measurement read back writes the same record again. What a record does not keep reads as None
(or NaN for a figure every fresh run has), and is never written back."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmperf import EngineInfo, RunTrace, Workload, summarize
from pytest_llmperf.baselines.records import stored
from pytest_llmperf.core import catalog
from pytest_llmperf.core.fingerprint import Fingerprint, subject
from pytest_llmperf.core.measurement import PART_COLUMNS, RUN_COLUMNS, Measurement

DATA = Path(__file__).parent / "data"


def _measurement(runs: int = 3, tokens: int = 5) -> Measurement:
    ms = 1_000_000
    traces = [
        RunTrace(
            start_ns=0,
            prefill_done_ns=9 * ms,
            token_ns=tuple((10 + i + k * (1 + i / 7)) * ms for k in range(tokens)),
            prompt_tokens=7,
        )
        for i in range(runs)
    ]
    return summarize(traces, Workload(max_tokens=tokens, runs=runs), EngineInfo(engine="test", model="m"))


def test_the_stored_columns_are_the_catalogs_per_run_metrics_and_parts() -> None:
    """One fact, two modules that may not import each other at run time: the record's per-run
    columns are the catalog's per-run metrics and parts, in the catalog's order."""
    assert tuple(catalog.RUN_FIELDS) == RUN_COLUMNS
    assert tuple(p.name for p in catalog.PARTS) == PART_COLUMNS


def test_a_stored_measurement_is_a_measurement_that_writes_its_record_again() -> None:
    m = _measurement()
    rec = stored(m, Fingerprint({"cpu": "c"}, subject(m.engine)), commit=None, recorded_at="now")
    assert type(rec) is Measurement
    again = Measurement.from_json(json.loads(json.dumps(rec.to_json())))
    assert again.to_json() == rec.to_json() and list(again.to_json()) == list(rec.to_json())
    # Its runs hold what the record keeps, to six significant figures, and what follows from it.
    for fresh, back in zip(m.runs, again.runs):
        assert back.ttft_ms == float(f"{fresh.ttft_ms:.6g}") and back.tpot_ms == float(f"{fresh.tpot_ms:.6g}")
        assert back.output_tokens == fresh.output_tokens and len(back.itl_ms) == len(fresh.itl_ms)
        assert math.isclose(back.e2e_ms, fresh.e2e_ms, rel_tol=1e-5)
        assert back.prefill_ms is None  # not kept per run
    assert again.workload is None and again.identity is not None and again.identity.max_tokens == 5
    assert again.engine.engine == "test" and again.engine.model == "m"
    assert again.itl.count == m.itl.count and math.isclose(again.itl.p95_ms, m.itl.p95_ms, rel_tol=1e-5)


def test_every_record_earlier_versions_wrote_reads_into_a_measurement_and_writes_back() -> None:
    records = []
    for path in [*DATA.glob("*.json"), *DATA.glob("release-0.1/**/*.json")]:
        doc = json.loads(path.read_text())
        records += [e for per in (doc.get("tests") or {}).values() for e in per.values()]
        records += [r[k] for r in doc.get("results") or [] for k in ("record", "baseline_record") if r.get(k)]
    assert len(records) > 20
    for rec in records:
        m = Measurement.from_json(rec)
        assert json.dumps(m.to_json(), sort_keys=True) == json.dumps(rec, sort_keys=True)
        assert not m.unread and not m.unread_runs and not m.unread_parts, (m.unread, m.unread_runs)
        assert len(m.runs) == rec["summary"]["n_runs"]


def test_a_figure_a_hand_made_record_lacks_is_not_written_back() -> None:
    m = Measurement.read({"runs": {"tpot_ms": [2.0, 2.5]}})
    assert [r.tpot_ms for r in m.runs] == [2.0, 2.5] and all(math.isnan(r.ttft_ms) for r in m.runs)
    assert m.to_json()["runs"] == {"tpot_ms": [2.0, 2.5]} and "itl_ms" not in m.to_json()


def test_per_run_values_of_the_wrong_kind_are_kept_as_they_came() -> None:
    m = Measurement.read({"runs": {"tpot_ms": [2.0, "x"], "ttft_ms": [1, 2]}, "parts": {"tokenize_ms": True}})
    assert m.unread_runs == {"tpot_ms": [2.0, "x"]} and m.unread_parts == {"tokenize_ms": True}
    assert dict(m.run_columns) == {"ttft_ms": (1, 2), "tpot_ms": [2.0, "x"]}
    assert m.to_json()["runs"] == {"ttft_ms": [1, 2], "tpot_ms": [2.0, "x"]}


numbers = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=6).flatmap(
        lambda n: st.tuples(
            st.dictionaries(st.sampled_from(RUN_COLUMNS), st.lists(numbers, min_size=n, max_size=n)),
            st.dictionaries(st.sampled_from(PART_COLUMNS), st.lists(numbers, min_size=n, max_size=n)),
            st.lists(st.lists(numbers, min_size=1, max_size=4), min_size=n, max_size=n),
        )
    )
)
def test_any_record_of_per_run_values_reads_and_writes_back_as_it_was(columns) -> None:
    runs, parts, itl = columns
    sig = {k: [float(f"{v:.6g}") for v in vs] for k, vs in runs.items()}
    part_sig = {k: [float(f"{v:.6g}") for v in vs] for k, vs in parts.items()}
    itl_sig = [[float(f"{v:.6g}") for v in run] for run in itl]
    rec = {"runs": sig, "itl_ms": itl_sig, **({"parts": part_sig} if part_sig else {})}
    out = Measurement.read(json.loads(json.dumps(rec))).to_json()
    assert out["runs"] == {k: sig[k] for k in RUN_COLUMNS if k in sig}
    assert out["itl_ms"] == itl_sig and out.get("parts", {}) == {k: part_sig[k] for k in PART_COLUMNS if k in part_sig}


def test_replace_keeps_a_measurement_a_record() -> None:
    """``carry_history``'s way: a stored measurement with its sessions replaced writes them."""
    m = _measurement()
    rec = stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now")
    with_sessions = replace(rec, sessions={"tpot_ms": [{"log_level": 0.1}]})
    assert with_sessions.to_json()["sessions"] == {"tpot_ms": [{"log_level": 0.1}]}
    assert list(with_sessions.to_json())[-1] == "sessions"
