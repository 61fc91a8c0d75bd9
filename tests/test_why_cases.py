"""benchmarks/why_cases.py's reading of session files (issue 36 point 5): which parts a
comparison flagged, and whether it named the case's cause. Fixture documents only: the script's
sessions are real pytest runs of minutes each (run the script itself for those)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "why_cases.py"


@pytest.fixture(scope="module")
def why():
    spec = importlib.util.spec_from_file_location("why_cases", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["why_cases"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("why_cases", None)


def part(metric, phase, a, b, moved, **more):
    return {
        "metric": metric,
        "label": metric,
        "phase": phase,
        "unit": "ms" if phase == "prefill" else "ms/token",
        "a_median": a,
        "b_median": b,
        "delta": b - a,
        "moved": moved,
        "paired": True,
        **more,
    }


def against_doc(verdicts, parts, attribution=None):
    """A session file with one test judged against REF: ``verdicts`` per headline metric."""
    comparisons = [
        {
            "metric": m,
            "ratio": 1.08,
            "ci_low": 1.05,
            "ci_high": 1.1,
            "verdict": v,
            "n_candidate": 20,
            "reference": "git:x",
        }
        for m, v in verdicts.items()
    ]
    verdict = {"status": "REGRESSION", "comparisons": comparisons, "parts": parts}
    if attribution is not None:
        verdict["attribution"] = attribution
    return {"results": [{"test": "test_wrapper", "verdict": verdict}]}


def ab_doc(ci, parts, attribution=None):
    """A session file with one A/B entry: ``ci`` (low, high) per headline metric."""
    comparisons = [
        {"metric": m, "phase": "x", "ratio": (lo + hi) / 2, "ci_low": lo, "ci_high": hi, "n_pairs": 10}
        for m, (lo, hi) in ci.items()
    ]
    entry = {"label": "", "test": "test_case", "comparisons": comparisons, "parts": parts}
    if attribution is not None:
        entry["attribution"] = attribution
    return {"results": [], "ab": [entry]}


DECODE_OUTSIDE = [
    part("native_decode_ms_per_token", "decode", 10.0, 10.05, False),
    part("sampling_ms_per_token", "decode", 0.2, 0.2, False),
    part("decode_outside_ms_per_token", "decode", 0.3, 1.2, True),
    part("native_prefill_ms", "prefill", 50.0, 50.0, False),
]


def test_the_cause_flagged_alone_is_named(why):
    (entry,) = why.entries(against_doc({"ttft_ms": "UNCHANGED", "tpot_ms": "REGRESSION"}, DECODE_OUTSIDE))
    assert entry.moved_phases == ("decode",) and entry.pairs == 20
    o = why.classify(entry, why.CASES["a"])
    assert o.flagged == ("decode_outside_ms_per_token",) and o.named is True and o.others == ()


def test_a_part_that_moved_in_a_phase_that_did_not_is_not_flagged_but_counts_in_aa(why):
    parts = [*DECODE_OUTSIDE, part("tokenize_ms", "prefill", 1.0, 1.5, True)]
    (entry,) = why.entries(against_doc({"ttft_ms": "UNCHANGED", "tpot_ms": "REGRESSION"}, parts))
    o = why.classify(entry, why.CASES["aa-against"])
    assert o.flagged == ("decode_outside_ms_per_token",)
    assert set(o.any_moved) == {"decode_outside_ms_per_token", "tokenize_ms"}
    assert o.named is None  # an A/A names no cause
    tally = why.Tally(why.CASES["aa-against"], outcomes=[o], seconds=[30.0], loads=["2.5 2.0 1.0"])
    assert why.row(tally) == ["aa-against", "1", "-", "-", "-", "-", "1/1", "20", "30", "2.5-2.5", "0"]


def test_an_unchanged_aa_flags_nothing(why):
    quiet = [{**p, "moved": False, "b_median": p["a_median"], "delta": 0.0} for p in DECODE_OUTSIDE]
    (entry,) = why.entries(against_doc({"ttft_ms": "UNCHANGED", "tpot_ms": "UNCHANGED"}, quiet))
    o = why.classify(entry, why.CASES["aa-against"])
    assert o.flagged == () and o.any_moved == ()
    tally = why.Tally(why.CASES["aa-against"], outcomes=[o, o], seconds=[1.0, 3.0], loads=["1 1 1", "3 1 1"])
    assert why.row(tally)[6] == "0/2"


def test_the_cause_is_named_only_when_it_is_the_largest_flagged_part(why):
    parts = [
        part("native_decode_ms_per_token", "decode", 10.0, 12.0, True),
        part("decode_outside_ms_per_token", "decode", 0.3, 1.2, True),
    ]
    (entry,) = why.entries(against_doc({"tpot_ms": "REGRESSION"}, parts))
    o = why.classify(entry, why.CASES["a"])
    assert set(o.flagged) == {"native_decode_ms_per_token", "decode_outside_ms_per_token"}
    assert o.largest == {"decode": "native_decode_ms_per_token"}
    assert o.named is False and o.others == ("native_decode_ms_per_token",)


def test_nothing_is_named_when_the_headline_did_not_move(why):
    (entry,) = why.entries(against_doc({"ttft_ms": "UNCHANGED", "tpot_ms": "INCONCLUSIVE"}, DECODE_OUTSIDE))
    o = why.classify(entry, why.CASES["a"])
    assert o.flagged == () and o.named is False and o.any_moved == ("decode_outside_ms_per_token",)
    # the table still says the cause's part moved: it is more sensitive than the headline
    assert why.row(why.Tally(why.CASES["a"], outcomes=[o], seconds=[1.0], loads=["1 1 1"]))[2:4] == ["0/1", "1/1"]


def test_an_ab_entry_moves_a_phase_by_its_ci_and_the_attribution_must_agree(why):
    parts = [
        part("native_decode_ms_per_token", "decode", 10.0, 6.0, True),
        part("decode_outside_ms_per_token", "decode", 0.3, 0.31, False),
        part("native_prefill_ms", "prefill", 50.0, 51.0, False),
    ]
    ci = {"ttft_ms": (0.98, 1.04), "tpot_ms": (0.58, 0.62)}
    matmul = {
        "phases": {
            "decode": {"layers": [], "ops": [], "groups": [], "reading": "matrix multiplication -41%, attention +1%"}
        }
    }
    (entry,) = why.entries(ab_doc(ci, parts, matmul))
    assert entry.moved_phases == ("decode",) and entry.pairs == 10 and entry.test == "test_case"
    o = why.classify(entry, why.CASES["b"])
    assert o.named is True and o.attribution_ok is True and "matrix multiplication" in o.attribution
    # the same parts with a reading that names another op: the cause is not proven
    other = {"phases": {"decode": {"reading": "ROPE -40%, the rest unchanged"}}}
    (entry,) = why.entries(ab_doc(ci, parts, other))
    o = why.classify(entry, why.CASES["b"])
    assert o.attribution_ok is False and o.named is True  # the parts named it; the attribution did not
    tally = why.Tally(why.CASES["b"], outcomes=[o], seconds=[1.0], loads=["1 1 1"])
    assert why.row(tally)[2:5] == ["1/1", "1/1", "0/1"]
    # the other phase's llama.cpp part moving too is the same cause, not another part
    both = [*parts[:2], part("native_prefill_ms", "prefill", 50.0, 70.0, True)]
    (entry,) = why.entries(ab_doc({"ttft_ms": (1.3, 1.5), "tpot_ms": (0.58, 0.62)}, both, matmul))
    o = why.classify(entry, why.CASES["b"])
    assert o.flagged == ("native_decode_ms_per_token", "native_prefill_ms") and o.others == () and o.named
    # no attribution pass at all: not proven either
    (entry,) = why.entries(ab_doc(ci, parts))
    assert why.classify(entry, why.CASES["b"]).attribution_ok is False


def test_the_attribution_is_read_from_moved_ops_and_the_reading(why):
    block = {"reading": "", "ops": [{"name": "SOFT_MAX", "moved": True}, {"name": "MUL_MAT", "moved": False}]}
    att = {"phases": {"prefill": block}}
    assert why.attribution_check(att, "prefill", why.ATTENTION_OPS) == ("", True)
    assert why.attribution_check(att, "prefill", ("MUL_MAT",)) == ("", False)
    assert why.attribution_check(att, "decode", ("MUL_MAT",)) == ("", False)
    uniform = {"phases": {"decode": {"reading": "uniform across layers: a kernel or memory change"}}}
    assert why.attribution_check(uniform, "decode", ("uniform",))[1] is True


def test_a_session_that_compared_nothing_gives_no_entry_and_counts_against_the_case(why):
    not_compared = {"results": [{"test": "t", "verdict": {"status": "NEW", "comparisons": []}}]}
    assert why.entries(not_compared) == [] and why.entries({}) == []
    tally = why.Tally(why.CASES["a"], failed=["side REF could not start"], seconds=[5.0], loads=["1 1 1"])
    assert why.row(tally)[:6] == ["a", "1", "0/1", "0/1", "-", "0/1"] and why.row(tally)[-1] == "1"


def test_case_selection_expands_groups_and_refuses_unknown_names(why):
    assert [c.name for c in why.selected("aa,f,a")] == [
        "aa-against",
        "aa-ab",
        "aa-served",
        "aa-python",
        "f-client",
        "f-server",
        "a",
    ]
    with pytest.raises(SystemExit, match="unknown case 'z'"):
        why.selected("a,z")


@pytest.mark.parametrize("name", ["b", "c", "d", "aa-ab", "f-client", "f-server", "aa-served"])
def test_each_ab_case_writes_a_test_module_that_compiles(why, name, tmp_path, monkeypatch):
    monkeypatch.setattr(why, "_model", lambda preset: f"/models/{preset}.gguf")
    monkeypatch.setattr(why, "_q8", lambda preset: f"/models/{preset}-q8_0.gguf")
    project = why.make_project(tmp_path / "p", why.CASES[name], 7, "/old/python")
    source = (project.root / "tests" / "test_case.py").read_text()
    compile(source, "test_case.py", "exec")
    assert "runs=7" in source and project.args == ()
    default = why.make_project(tmp_path / "q", why.CASES[name], None, "/old/python")
    assert "runs=" not in (default.root / "tests" / "test_case.py").read_text()  # the plugin's default
    if name == "f-client":
        assert f"CLIENT_MS = {why.CLIENT_MS!r}" in source and "A_THREADS, B_THREADS = 1, 1" in source
    if name == "b":
        assert "/models/small-q8_0.gguf" in source and "'repack': False" in source
    if name == "f-server":
        assert "CLIENT_MS = 0.0" in source and "A_THREADS, B_THREADS = 2, 1" in source


def test_llama_bench_ratios_are_this_build_over_the_old_one_in_time(why, tmp_path):
    """Each build's llama-bench JSON (pp then tg rows) read back: time ratio = old t/s / new t/s."""

    def fake(name, pp_ts, tg_ts):
        rows = [{"n_prompt": 32, "n_gen": 0, "avg_ts": pp_ts}, {"n_prompt": 0, "n_gen": 32, "avg_ts": tg_ts}]
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\necho '{json.dumps(rows)}'\n")
        path.chmod(0o755)
        return path

    old, new = fake("old", 200.0, 30.0), fake("new", 100.0, 40.0)
    assert why.bench_ts(old, "m.gguf", 32, 32) == (200.0, 30.0)
    pp, tg = why.llama_bench_ratios(old, new, "m.gguf", 32, 32, rounds=2)
    assert pp == pytest.approx(2.0) and tg == pytest.approx(0.75)


@pytest.mark.parametrize("runs", [None, 7])
def test_against_cases_make_a_git_repository_whose_ref_is_the_commit_before(why, runs, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # against_sessions, as main() puts it first
    project = why.make_project(tmp_path / "a", why.CASES["a"], runs, "/old/python")
    assert project.args == ("--llmperf-against", "git:HEAD~1")
    source = (project.root / "tests" / "test_wrapper.py").read_text()
    assert ("runs=7" in source) == (runs == 7)
    assert "EXTRA = 0.08" in (project.root / "wrapper" / "__init__.py").read_text()
    e = why.make_project(tmp_path / "e", why.CASES["e"], runs, "/old/python")
    assert e.args == ("--llmperf-against", "python:/old/python")
