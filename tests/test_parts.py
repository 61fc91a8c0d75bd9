"""Where a change went: the parts of each phase compared (judge.parts)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmperf.core import catalog
from pytest_llmperf.judge import parts as P
from pytest_llmperf.judge.verdict import Comparison, Verdict

DECODE = ("native_decode_ms_per_token", "sampling_ms_per_token", "decode_outside_ms_per_token")


def _runs(n: int, seed: int, *, eval_ms: float = 10.0, sampling_ms: float = 0.5, outside_ms: float = 1.0) -> list[Any]:
    """Runs whose TPOT is eval + sampling + outside, each with its own noise (1%)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        e, s, o = (x * (1 + 0.01 * rng.standard_normal()) for x in (eval_ms, sampling_ms, outside_ms))
        pe, po, tok = 50.0 * (1 + 0.01 * rng.standard_normal()), 2.0 * (1 + 0.01 * rng.standard_normal()), 0.2
        out.append(
            SimpleNamespace(
                ttft_ms=pe + po + tok,
                tpot_ms=e + s + o,
                tokenize_ms=tok,
                native_prefill_ms=pe,
                prefill_outside_ms=po,
                native_decode_ms_per_token=e,
                sampling_ms_per_token=s,
                python_sampling_ms_per_token=None,
                decode_outside_ms_per_token=o,
            )
        )
    return out


def _by(parts: tuple[P.PartChange, ...]) -> dict[str, P.PartChange]:
    return {p.metric: p for p in parts}


def test_every_part_is_a_catalog_metric_with_its_unit_source_and_phase_time() -> None:
    for m in catalog.PARTS:
        assert m.unit in ("ms", "ms/token") and m.source and m.part_of in ("ttft_ms", "tpot_ms")
        assert catalog.METRICS[m.part_of].phase == m.phase


def test_more_work_outside_llama_cpp_is_the_part_that_moved_and_llama_cpp_is_unchanged() -> None:
    a = _runs(20, 1)
    b = _runs(20, 2, outside_ms=1.9)  # +0.9 ms/token outside llama.cpp: ~+8% TPOT
    got = _by(P.paired_parts(a, b, alpha=0.01))
    out = got["decode_outside_ms_per_token"]
    assert out.moved and out.delta_low < 0.9 < out.delta_high and out.ratio is None and out.paired
    assert not got["native_decode_ms_per_token"].moved
    ratio = got["native_decode_ms_per_token"]
    assert ratio.ratio is not None and ratio.ratio_low is not None and ratio.ratio_low < 1.0 < (ratio.ratio_high or 0)
    assert not any(p.moved for p in got.values() if p.phase == "prefill")


def test_slower_llama_cpp_eval_is_named_with_its_ratio() -> None:
    a = _runs(12, 3)
    b = _runs(12, 4, eval_ms=13.0)
    got = _by(P.paired_parts(a, b, alpha=0.01))
    e = got["native_decode_ms_per_token"]
    assert e.moved and e.ratio is not None and 1.25 < e.ratio < 1.35
    assert P.llama_cpp_moved(tuple(got.values()), "decode") and not P.llama_cpp_moved(tuple(got.values()), "prefill")
    assert not got["decode_outside_ms_per_token"].moved


def test_a_significant_change_too_small_to_explain_anything_did_not_move() -> None:
    a = _runs(40, 5)
    b = [SimpleNamespace(**{**vars(r), "sampling_ms_per_token": r.sampling_ms_per_token + 0.01}) for r in a]
    got = _by(P.paired_parts(a, b, alpha=0.01))
    s = got["sampling_ms_per_token"]
    assert s.p_value < 0.01 and not s.moved  # 0.01 ms of an 11.5 ms TPOT: under MATERIAL_SHARE


def test_a_part_not_observed_in_every_run_is_left_out() -> None:
    a, b = _runs(8, 6), _runs(8, 7)
    b[3].sampling_ms_per_token = None
    assert "sampling_ms_per_token" not in _by(P.paired_parts(a, b, alpha=0.01))
    with pytest.raises(ValueError, match="pairs need both"):
        P.paired_parts(a, b[:-1], alpha=0.01)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=3, max_value=30), st.integers(min_value=0, max_value=2**31 - 1))
def test_identical_sides_never_move_a_part(n: int, seed: int) -> None:
    a = _runs(n, seed)
    got = P.paired_parts(a, a, alpha=0.05)
    assert got and not any(p.moved for p in got)
    assert all(p.delta == 0.0 and p.p_value == 1.0 for p in got)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=6, max_value=25), st.floats(min_value=-3.0, max_value=3.0), st.integers(0, 2**31 - 1))
def test_a_constant_shift_lies_in_its_ci_and_holm_never_lowers_p(n: int, shift: float, seed: int) -> None:
    a = _runs(n, seed)
    b = [
        SimpleNamespace(**{**vars(r), "decode_outside_ms_per_token": r.decode_outside_ms_per_token + shift}) for r in a
    ]
    out = _by(P.paired_parts(a, b, alpha=0.05))["decode_outside_ms_per_token"]
    assert out.delta_low - 1e-9 <= shift <= out.delta_high + 1e-9
    assert abs(out.delta - shift) < 1e-9


def test_against_a_baseline_between_session_noise_keeps_a_uniform_session_shift_unflagged() -> None:
    a, b = _runs(10, 8), _runs(10, 9, eval_ms=10.4)  # +4% eval: what a slower session does
    base = {m.name: [getattr(r, m.name) for r in a] for m in catalog.PARTS}
    cand = {m.name: [getattr(r, m.name) for r in b] for m in catalog.PARTS}
    phase_ms = {"ttft_ms": 52.2, "tpot_ms": 11.5}
    quiet = _by(P.unpaired_parts(base, cand, phase_ms, alpha=0.01, between_sd={}))
    noisy = _by(P.unpaired_parts(base, cand, phase_ms, alpha=0.01, between_sd={"decode": 0.05, "prefill": 0.05}))
    assert quiet["native_decode_ms_per_token"].moved and not quiet["native_decode_ms_per_token"].paired
    assert not noisy["native_decode_ms_per_token"].moved
    far = {**cand, "decode_outside_ms_per_token": [v + 3.0 for v in cand["decode_outside_ms_per_token"]]}
    assert _by(P.unpaired_parts(base, far, phase_ms, alpha=0.01, between_sd={"decode": 0.05}))[
        "decode_outside_ms_per_token"
    ].moved


def _comparison(phase: str, metric: str, label: str, ratio: float, verdict: Verdict) -> Comparison:
    return Comparison(
        metric=metric,
        label=label,
        phase=phase,
        unit="ms",
        higher_is_better=False,
        threshold=0.05,
        baseline_value=10.0,
        candidate_value=10.0 * ratio,
        ratio=ratio,
        ci_low=ratio - 0.03,
        ci_high=ratio + 0.03,
        p_value=0.001,
        p_value_better=0.9,
        n_baseline=20,
        n_candidate=20,
        cv_baseline=0.01,
        cv_candidate=0.01,
        verdict=verdict,
        reason="",
    )


def test_the_verdict_line_names_the_parts_that_moved_and_those_that_did_not() -> None:
    parts = P.paired_parts(_runs(20, 10), _runs(20, 11, outside_ms=1.9), alpha=0.01)
    decode = _comparison("decode", "tpot_ms", "TPOT", 1.088, Verdict.REGRESSION)
    prefill = _comparison("prefill", "ttft_ms", "TTFT", 1.0, Verdict.UNCHANGED)
    lines = P.why_lines([prefill, decode], parts)
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("decode TPOT +8.8% (1.058..1.118): moved: outside llama.cpp +0.")
    assert "ms/token (" in line and "unchanged: llama.cpp eval x1.0" in line and "sampling (llama.cpp) x1." in line


def test_a_part_change_round_trips_through_json() -> None:
    parts = P.paired_parts(_runs(6, 12), _runs(6, 13, eval_ms=12.0), alpha=0.01)
    for p in parts:
        assert P.PartChange.from_json(json.loads(json.dumps(p.to_json()))) == p
        assert p.line().startswith(p.phase)


def test_ten_pairs_at_alpha_001_are_enough_to_name_a_part_and_zero_tokenization_is_left_out() -> None:
    """Holm runs over a phase's parts (its line is one family): 10 pairs all one way give an exact
    signed-rank p of 2/1024, which passes alpha 0.01 over a phase's 3 parts."""
    a = [SimpleNamespace(**{**vars(r), "tokenize_ms": 0.0}) for r in _runs(10, 14)]
    b = [SimpleNamespace(**{**vars(r), "tokenize_ms": 0.0}) for r in _runs(10, 15, eval_ms=70.0)]
    got = _by(P.paired_parts(a, b, alpha=0.01))
    assert got["native_decode_ms_per_token"].moved and "tokenize_ms" not in got
    assert got["native_decode_ms_per_token"].p_value == pytest.approx(3 * 2 / 1024)


def test_a_part_is_tested_only_in_a_phase_whose_headline_moved() -> None:
    """Two side processes' llama.cpp time can differ by a few percent for a whole session, which
    the pairs do not cancel: the part's CI excludes 0 while the phase is UNCHANGED. The headline
    gates its parts, so that A/A flags nothing."""
    a = _runs(20, 16)
    b = _runs(20, 17, eval_ms=10.4)  # llama.cpp eval x1.04, the phase within its threshold
    raw = _by(P.paired_parts(a, b, alpha=0.01))
    assert raw["native_decode_ms_per_token"].moved  # significant and material on its own
    unchanged = _comparison("decode", "tpot_ms", "TPOT", 1.035, Verdict.UNCHANGED)
    prefill = _comparison("prefill", "ttft_ms", "TTFT", 1.0, Verdict.UNCHANGED)
    gated = P.gated(tuple(raw.values()), P.explained_phases([prefill, unchanged]))
    assert not any(p.moved for p in gated) and not P.llama_cpp_moved(gated)
    assert [dataclasses.replace(p, moved=q.moved) for p, q in zip(gated, raw.values())] == list(raw.values())
    moved = _comparison("decode", "tpot_ms", "TPOT", 1.09, Verdict.REGRESSION)
    kept = _by(P.gated(tuple(raw.values()), P.explained_phases([prefill, moved])))
    assert kept["native_decode_ms_per_token"].moved
    # an A/B has no verdict: its phase moved when the headline's CI excludes 1
    assert P.paired_explained_phases([moved, prefill]) == {"decode"}


def test_a_tail_regression_opens_its_phases_parts_while_the_headline_is_undecided() -> None:
    """``--llmperf-against``'s pairs stop on an ITL p95 REGRESSION whose whole CI lies beyond the
    tail threshold while TPOT may still be INCONCLUSIVE (10 pairs over 2 process pairs): the red
    run still says where decode's time went (its parts tested, TPOT's line naming them); a
    mirrored rate opens nothing of its own, and an UNCHANGED tail none."""
    a = _runs(20, 16)
    b = _runs(20, 17, eval_ms=10.4)
    raw = tuple(P.paired_parts(a, b, alpha=0.01))
    tpot = _comparison("decode", "tpot_ms", "TPOT", 1.03, Verdict.INCONCLUSIVE)
    tail = _comparison("decode", "itl_p95_ms", "ITL p95", 1.3, Verdict.REGRESSION)
    assert P.explained_phases([tpot, tail]) == {"decode"}
    kept = P.gated(raw, P.explained_phases([tpot, tail]))
    assert _by(kept)["native_decode_ms_per_token"].moved
    (line,) = P.why_lines([tpot, tail], kept)
    assert line.startswith("decode TPOT +3.0%") and "moved: llama.cpp eval x1.0" in line
    assert P.explained_phases([tpot, dataclasses.replace(tail, verdict=Verdict.UNCHANGED)]) == frozenset()
    rate = dataclasses.replace(tail, metric="decode_tps", mirror_of="tpot_ms")
    assert P.explained_phases([tpot, rate]) == frozenset()


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=6, max_value=30),
    st.floats(min_value=0.5, max_value=2.0),
    st.floats(min_value=0.5, max_value=2.0),
    st.integers(0, 2**31 - 1),
)
def test_no_part_moves_in_a_phase_whose_headline_did_not_move(n: int, e: float, o: float, seed: int) -> None:
    a, b = _runs(n, seed), _runs(n, seed + 1, eval_ms=10.0 * e, outside_ms=o)
    parts = P.paired_parts(a, b, alpha=0.05)
    for verdict in (Verdict.UNCHANGED, Verdict.INCONCLUSIVE):
        c = _comparison("decode", "tpot_ms", "TPOT", 1.0, verdict)
        gated = P.gated(parts, P.explained_phases([c]))
        assert not any(p.moved for p in gated if p.phase == "decode")
        assert not any(p.moved for p in gated if p.phase == "prefill")  # no prefill headline: none
        assert P.why_lines([c], gated) == []
