"""Issue 48, point 1: the stability, per-layer timing, roofline and attribution sections are
typed end to end. Each class writes its stored form (``to_json``) and reads it back
(``from_json``) byte for byte, for any object the measuring code can build and for every stored
form the files earlier versions wrote; a malformed section raises, and a ``Measurement`` holds the
typed object (one its class cannot read is kept as it came, and written back as it was)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_llmperf.core.measurement import (
    CACHE_RESIDENT,
    HEAD_NAME,
    Attribution,
    LayerProfile,
    Measurement,
    Peak,
    PhaseAttribution,
    PhaseLayers,
    PhaseRoofline,
    Roofline,
    Slice,
    Stability,
)

RELEASE = Path(__file__).resolve().parent / "data" / "release-0.1"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

figures = st.floats(allow_nan=False, allow_infinity=False, width=64)
positive = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False)
maybe = st.none() | figures
counts = st.integers(min_value=0, max_value=10_000)
words = st.text(max_size=30)


def _dumped(section: object, sort_keys: bool = False) -> str:
    return json.dumps(section, allow_nan=False, sort_keys=sort_keys)


def _round_trip(cls: type, obj: object, *args: str) -> None:
    """``obj`` written, through JSON, read back and written again: the same bytes."""
    once = _dumped(obj.to_json())  # type: ignore[attr-defined]
    again = cls.from_json(*args, json.loads(once)).to_json()
    assert _dumped(again) == once


stabilities = st.builds(
    Stability,
    n_runs=counts,
    tpot_cv=figures,
    tpot_spread_pct=figures,
    ttft_cv=figures,
    first_run_slowdown=maybe,
    first_run_ttft_slowdown=maybe,
    first_token_slowdown=figures,
    context_slope_us_per_token=maybe,
    context_span=st.none() | st.tuples(counts, counts),
    far_runs=st.lists(counts, max_size=5).map(tuple),
    warnings=st.lists(words, max_size=3).map(tuple),
)


@st.composite
def phase_layers(draw: st.DrawFn, phase: str = "decode", n: int | None = None) -> PhaseLayers:
    n = draw(st.integers(1, 6)) if n is None else n
    names = (*(f"layer {i}" for i in range(n - 1)), HEAD_NAME)
    ms = st.lists(positive, min_size=n, max_size=n).map(tuple)
    return PhaseLayers(
        phase=phase,
        names=names,
        median_ms=draw(ms),
        step_ms=draw(positive),
        n_runs=draw(counts),
        n_steps=draw(counts),
        per_run_ms=tuple(draw(st.lists(ms, max_size=4))),
        outliers=tuple(draw(st.lists(st.sampled_from(names), max_size=2, unique=True))),
        coverage=draw(positive),
    )


@st.composite
def profiles(draw: st.DrawFn) -> LayerProfile:
    n = draw(st.integers(1, 6))
    return LayerProfile(
        prefill=draw(phase_layers("prefill", n)),
        decode=draw(phase_layers("decode", n)),
        tpot_ms=draw(positive),
        plain_prefill_ms=draw(st.none() | positive),
        plain_tpot_ms=draw(st.none() | positive),
    )


def phase_rooflines(phase: str) -> st.SearchStrategy[PhaseRoofline]:
    return st.builds(
        PhaseRoofline,
        phase=st.just(phase),
        bytes_per_token=positive,
        flops_per_token=positive,
        intensity_flop_per_byte=positive,
        bound_tps=positive,
        achieved_tps=positive,
        achieved_bw_gbs=positive,
        mbu=positive,
        mfu=positive,
        verdict=st.sampled_from(["memory-bound", "compute-bound", CACHE_RESIDENT]),
        note=st.just("") | words,
    )


peaks = st.builds(Peak, value=positive, source=st.sampled_from(["measured", "given", "cpu spec"]), detail=words)
rooflines = st.builds(
    Roofline,
    peak_bw=peaks,
    peak_tflops=peaks,
    context_tokens=positive,
    weights_bytes=counts,
    kv_bytes_per_token_of_context=positive,
    decode=phase_rooflines("decode"),
    prefill=st.none() | phase_rooflines("prefill"),
)
slices = st.builds(Slice, name=words, median_ms=positive, per_run_ms=st.lists(positive, max_size=4).map(tuple))


def phase_attributions(phase: str) -> st.SearchStrategy[PhaseAttribution]:
    kinds = st.lists(slices, max_size=3).map(tuple)
    return st.builds(
        PhaseAttribution,
        phase=st.just(phase),
        layers=kinds,
        ops=kinds,
        groups=kinds,
        step_ms=positive,
        nodes_ms=positive,
        coverage=positive,
        nodes=counts,
        n_runs=counts,
        n_steps=counts,
        blocks=st.none() | slices,
    )


attributions = st.builds(
    Attribution,
    prefill=phase_attributions("prefill"),
    decode=phase_attributions("decode"),
    tpot_ms=positive,
    plain_prefill_ms=st.none() | positive,
    plain_tpot_ms=st.none() | positive,
    wall_s=positive,
)


@SETTINGS
@given(stabilities)
def test_stability_round_trips(s: Stability) -> None:
    _round_trip(Stability, s)


@SETTINGS
@given(profiles())
def test_layer_profile_round_trips_with_its_stored_shares_and_ratios(p: LayerProfile) -> None:
    _round_trip(LayerProfile, p)
    read = LayerProfile.from_json(json.loads(_dumped(p.to_json())))
    assert read.tpot_ms is None and read.plain_tpot_ms is None  # not stored
    assert read.to_json()["overhead_ratio"] == p.to_json()["overhead_ratio"]  # as stored, not recomputed


@SETTINGS
@given(rooflines)
def test_roofline_round_trips_with_its_stored_balance(r: Roofline) -> None:
    _round_trip(Roofline, r)
    read = Roofline.from_json(json.loads(_dumped(r.to_json())))
    assert read.kv_bytes_per_token_of_context is None  # not stored
    assert read.peak_bw.source == r.peak_bw.source and read.decode.verdict == r.decode.verdict


@SETTINGS
@given(attributions)
def test_attribution_round_trips(a: Attribution) -> None:
    _round_trip(Attribution, a)


def _release_records() -> list[dict]:
    out = []
    for path in RELEASE.glob("**/*.json"):
        doc = json.loads(path.read_text())
        out += [e for per in (doc.get("tests") or {}).values() for e in per.values()]
        out += [r[k] for r in doc.get("results") or [] for k in ("record", "baseline_record") if r.get(k)]
    return out


def test_the_release_files_sections_read_and_write_back_as_they_were() -> None:
    records = _release_records()
    assert len(records) >= 10
    classes = {"stability": Stability, "layers": LayerProfile, "roofline": Roofline, "attribution": Attribution}
    seen = 0
    for rec in records:
        for name, cls in classes.items():
            if rec.get(name) is not None:
                # (the files are written with their keys sorted)
                assert _dumped(cls.from_json(rec[name]).to_json(), True) == _dumped(rec[name], True), name
                seen += 1
        read = Measurement.read(rec)
        assert isinstance(read.stability, Stability) and not read.unread
        assert _dumped(read.to_json(), True) == _dumped(rec, True)
    assert seen >= 10


GOOD_STABILITY = Stability(3, 0.01, 2.0, 0.02, None, None, 1.1, 0.5, (10, 40), (), ("w",)).to_json()


@pytest.mark.parametrize(
    "damage",
    [
        {"n_runs": None},
        {"tpot_cv": "fast"},
        {"context_span": [1]},
        {"far_runs": "0"},
        {"warnings": [1]},
        {"n_runs": True},
    ],
)
def test_a_malformed_stability_raises(damage: dict) -> None:
    with pytest.raises((KeyError, TypeError, ValueError)):
        Stability.from_json({**GOOD_STABILITY, **damage})
    with pytest.raises(KeyError):
        Stability.from_json({k: v for k, v in GOOD_STABILITY.items() if k != "ttft_cv"})


def test_malformed_layers_and_rooflines_raise() -> None:
    phase = {"names": ["layer 0", "output"], "median_ms": [1.0, 0.5]}
    good = {"phases": {"prefill": phase, "decode": phase}}
    assert LayerProfile.from_json(good).to_json() == good  # what it lacked is not written
    for bad in (
        {"phases": {"decode": phase}},
        {"phases": {"prefill": phase, "decode": {**phase, "median_ms": [1.0]}}},
        {"phases": {"prefill": phase, "decode": {**phase, "per_run_ms": [[1.0]]}}},
        {"phases": {"prefill": phase, "decode": {**phase, "names": "output"}}},
        {**good, "overhead_ratio": "x"},
        {"phases": []},
    ):
        with pytest.raises((KeyError, TypeError, ValueError)):
            LayerProfile.from_json(bad)
    decode = {k: 1.0 for k in ("bytes_per_token", "flops_per_token", "intensity_flop_per_byte", "bound_tps")}
    decode |= {k: 1.0 for k in ("achieved_tps", "achieved_bw_gbs", "mbu", "mfu")} | {"verdict": "memory-bound"}
    roof = {"peak_bw_gbs": 20.0, "peak_tflops": 0.5, "decode": decode}
    assert Roofline.from_json(roof).to_json() == roof
    for bad in ({**roof, "decode": None}, {**roof, "peak_bw_gbs": "x"}, {**roof, "decode": {**decode, "mbu": None}}):
        with pytest.raises((KeyError, TypeError, ValueError)):
            Roofline.from_json(bad)


def test_a_record_holds_the_typed_sections_and_keeps_an_unreadable_one_as_it_came() -> None:
    phase = {"names": ["layer 0", "output"], "median_ms": [1.0, 0.5], "per_run_ms": [[1.0, 0.5]]}
    damaged = {"phases": {"decode": phase}}
    stored = {"stability": GOOD_STABILITY, "layers": damaged, "attribution": "damaged"}
    r = Measurement.read(stored)
    assert isinstance(r.stability, Stability) and r.stability.context_span == (10, 40)
    assert r.layers is None and r.attribution is None
    assert r.unread == {"layers": damaged, "attribution": "damaged"}
    assert r.to_json()["layers"]["phases"]["decode"] == phase and r.stability.n_runs == 3
    written = r.to_json()
    assert {k: written[k] for k in stored} == stored and list(written).index("layers") < list(written).index(
        "attribution"
    )
    whole = Measurement.read({"layers": {"phases": {"prefill": phase, "decode": phase}}})
    assert isinstance(whole.layers, LayerProfile) and whole.layers.decode.per_run_ms == ((1.0, 0.5),)
    assert Measurement.read({"layers": "x", "roofline": [1]}).to_json().keys().isdisjoint({"layers", "roofline"})


@SETTINGS
@given(attributions)
def test_a_malformed_attribution_raises(a: Attribution) -> None:
    good = json.loads(_dumped(a.to_json()))
    decode = good["phases"]["decode"]
    for bad in (
        {**good, "tpot_ms": "fast"},
        {**good, "phases": []},
        {**good, "phases": {**good["phases"], "decode": {**decode, "nodes": 1.5}}},
        {**good, "phases": {**good["phases"], "decode": {**decode, "layers": [{"name": 1}]}}},
        {**good, "phases": {**good["phases"], "decode": {**decode, "ops": "MUL_MAT"}}},
    ):
        with pytest.raises((KeyError, TypeError, ValueError)):
            Attribution.from_json(bad)
