"""Where llama.cpp's time went: the per-node attribution pass (measuring.attribution) on real
llama.cpp, and two attributions compared (judge.attribution), with known answers."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from pytest_llmperf import LlamaCppEngine, Workload, measure
from pytest_llmperf.core.measurement import Attribution
from pytest_llmperf.judge.attribution import (
    AttributionChange,
    SliceChange,
    compare_attributions,
    layer_reading,
    op_reading,
    ratio_ci,
)
from pytest_llmperf.measuring.attribution import (
    ATTENTION,
    ATTRIBUTION_RUNS,
    COPIES,
    ELEMENTWISE,
    GROUPS,
    MATMUL,
    NORMALISATION,
    ROPE,
    AttributionPass,
    attribute,
    group_of,
    interleaved,
    layer_of,
    step_times,
)
from pytest_llmperf.measuring.interleave import pass_orders
from pytest_llmperf.models.gguf import ModelSpec, ensure_model

#: A model with one block much wider than the others (tests/test_profiling.py's): block 3's FFN is 16x as wide.
SLOW_LAYER = ModelSpec(name="slow-layer", n_layer=6, n_embd=256, n_ff=512, layer_ff=(512, 512, 512, 8192, 512, 512))
SIX_EQUAL = dataclasses.replace(SLOW_LAYER, name="six-equal", layer_ff=None)

#: ggml's op names as ``ggml_op_desc`` writes them (GLU and unary ops by their kind).
GGML_OPS = {
    "MUL_MAT",
    "MUL_MAT_ID",
    "ADD",
    "MUL",
    "RMS_NORM",
    "NORM",
    "ROPE",
    "SOFT_MAX",
    "FLASH_ATTN_EXT",
    "CPY",
    "CONT",
    "GET_ROWS",
    "SET_ROWS",
    "SWIGLU",
    "SCALE",
}

WORKLOAD = Workload(prompt_tokens=32, max_tokens=12, runs=5, warmup=1)


# -- rules on the names llama.cpp's graph uses ----------------------------------------------


def test_layer_of_reads_the_name_suffix_and_the_graph_order() -> None:
    assert layer_of(b"attn_out-3", None) == "layer 3"
    assert layer_of(b"Qcur-12 (view) (permuted)", None) == "layer 12"
    assert layer_of(b"cache_k_l7 (view)", None) == "layer 7"  # the KV cache's write
    assert layer_of(b"node_21", "layer 0") == "layer 0"  # FLASH_ATTN_EXT: unnamed, in its layer
    assert layer_of(b"node_21", None) == "other"
    assert layer_of(b"embd", None) == "input"
    assert layer_of(b"norm", "layer 3") == "output" and layer_of(b"result_output", "output") == "output"


def test_group_of_by_op_and_by_attention_names() -> None:
    assert group_of("MUL_MAT", b"ffn_up-0") == MATMUL
    assert group_of("MUL_MAT", b"attn_out-0") == MATMUL  # the projection is no attention
    assert group_of("MUL_MAT", b"kq-0") == ATTENTION  # K x Q, by its name
    assert group_of("MUL_MAT", b"kqv-2") == ATTENTION
    assert group_of("SOFT_MAX", b"kq_soft_max-0") == ATTENTION
    assert group_of("FLASH_ATTN_EXT", b"node_21") == ATTENTION
    assert group_of("CONT", b"kqv_out-0") == ATTENTION
    assert group_of("RMS_NORM", b"norm-0") == NORMALISATION
    assert group_of("MUL", b"attn_norm-0") == NORMALISATION  # the norm's weight
    assert group_of("MUL", b"result_norm") == NORMALISATION
    assert group_of("ROPE", b"Qcur-0") == ROPE
    assert group_of("SET_ROWS", b"cache_k_l0 (view)") == COPIES
    assert group_of("SWIGLU", b"ffn_swiglu-0") == ELEMENTWISE
    assert group_of("ADD", b"l_out-0") == ELEMENTWISE
    assert group_of("SOMETHING_NEW", b"x") == "other"


def test_a_steps_node_times_add_up_the_same_by_layer_op_and_group() -> None:
    ns = 1_000_000
    events = [
        ((b"embd", b"GET_ROWS", 0), ns),
        ((b"Qcur-0", b"MUL_MAT", ns), 3 * ns),
        ((b"node_5", b"FLASH_ATTN_EXT", 3 * ns), 4 * ns),
        ((b"l_out-0", b"ADD", 4 * ns), 5 * ns),
        ((b"result_output", b"MUL_MAT", 5 * ns), 7 * ns),
    ]
    t = step_times(events)
    assert t["layers"] == {"input": 1.0, "layer 0": 4.0, "output": 2.0}
    assert t["ops"] == {"GET_ROWS": 1.0, "MUL_MAT": 4.0, "FLASH_ATTN_EXT": 1.0, "ADD": 1.0}
    assert t["groups"] == {COPIES: 1.0, MATMUL: 4.0, ATTENTION: 1.0, ELEMENTWISE: 1.0}
    assert t["nodes"] == {"ms": 7.0, "count": 5.0}
    assert t["blocks"] == {"blocks": 4.0}  # the transformer blocks' total


# -- the pass on real llama.cpp --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_attribution(tiny_engine) -> Attribution:
    return attribute(tiny_engine, WORKLOAD)


def test_attribution_of_the_tiny_model(tiny_attribution: Attribution, tiny_engine) -> None:
    a = tiny_attribution
    n_layer = tiny_engine.info().n_layer
    for phase in (a.prefill, a.decode):
        names = [s.name for s in phase.layers]
        assert [f"layer {i}" for i in range(n_layer)] == [n for n in names if n.startswith("layer ")]
        assert set(names) <= {"input", "output", "other", *(f"layer {i}" for i in range(n_layer))}
        ops = {s.name for s in phase.ops}
        assert "MUL_MAT" in ops and ops <= GGML_OPS, ops  # llama.cpp's own names
        assert not ops & {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"}  # no-ops run with the next node
        assert {s.name for s in phase.groups} <= set(GROUPS) and MATMUL in {s.name for s in phase.groups}
        # The node times lie inside the step: each step's sum is at most its span, so the medians too.
        assert 0 < phase.nodes_ms <= phase.step_ms and 0 < phase.coverage <= 1.0
        assert phase.n_runs == ATTRIBUTION_RUNS and all(len(s.per_run_ms) == ATTRIBUTION_RUNS for s in phase.ops)
        assert phase.nodes > 4 * n_layer
        # The blocks' total per step: at most the node times, at least the largest block's median.
        assert phase.blocks is not None and phase.blocks.median_ms <= phase.nodes_ms
        assert phase.blocks.median_ms >= max(s.median_ms for s in phase.layers if s.name.startswith("layer "))
    assert a.decode.n_steps == ATTRIBUTION_RUNS * (WORKLOAD.max_tokens - 1)
    # The cost is measured against interleaved plain runs, not assumed.
    assert a.plain_tpot_ms and a.decode_overhead_ratio and a.decode_overhead_ratio > 0
    assert a.wall_s > 0
    assert Attribution.from_json(json.loads(json.dumps(a.to_json()))).to_json() == a.to_json()
    assert all(len(line) <= 80 for line in a.lines())


class _Logged:
    """The tiny engine, with each timed loop it runs logged: which context, in which order."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine, self.log = engine, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def info(self) -> Any:
        return self.engine.info()

    def run(self, workload: Workload, run_index: int) -> Any:
        self.log.append(("plain", run_index))
        return self.engine.run(workload, run_index)

    @property
    def lib(self) -> Any:
        return self.engine.lib

    def make_sampler(self) -> Any:
        return self.engine.make_sampler()

    def prompt_ids(self, workload: Workload) -> list[int]:
        return self.engine.prompt_ids(workload)

    def decode_feed(self, workload: Workload) -> Any:
        return self.engine.decode_feed(workload)

    def instrumented_context(self, cb_eval: Any, tokens: int) -> Any:
        return self.engine.instrumented_context(cb_eval, tokens)

    def timed_decode(self, ctx: Any, prompt_ids: Any, max_tokens: int, *, feed: Any, sampler: Any) -> Any:
        if ctx != self.engine._ctx:
            self.log.append(("instrumented", None))
        return self.engine.timed_decode(ctx, prompt_ids, max_tokens, feed=feed, sampler=sampler)


def test_the_pass_runs_after_the_timed_runs_on_its_own_context(tiny_engine) -> None:
    logged = _Logged(tiny_engine)
    m = measure(logged, WORKLOAD, attribution=True)
    timed = [i for i, (kind, index) in enumerate(logged.log) if kind == "plain" and index is not None and index >= 0]
    first_pass = next(i for i, (kind, _) in enumerate(logged.log) if kind == "instrumented")
    # Every measured run (and warm-up) came before the pass's first instrumented run.
    assert logged.log[: WORKLOAD.warmup + WORKLOAD.runs] == [("plain", -1)] + [("plain", i) for i in range(5)]
    assert timed[WORKLOAD.runs - 1] < first_pass
    assert m.n_runs == WORKLOAD.runs and m.attribution is not None
    assert m.attribution.decode.n_runs == ATTRIBUTION_RUNS
    plain = measure(tiny_engine, WORKLOAD)
    assert plain.attribution is None and plain.n_runs == m.n_runs


# -- two attributions compared -------------------------------------------------------------


def test_ratio_ci_is_moses_interval_of_the_runs() -> None:
    rng = np.random.default_rng(1)
    a = rng.lognormal(0, 0.05, 8)
    b = 1.5 * rng.lognormal(0, 0.05, 8)
    ratio, lo, hi = ratio_ci(a, b)
    assert lo is not None and hi is not None and lo < ratio < hi and lo > 1.3 and hi < 1.7
    # Its ends are where the exact Mann-Whitney test of a shift stops rejecting at 5%.
    assert mannwhitneyu(np.log(b) - np.log(lo) * 1.0001, np.log(a), method="exact").pvalue >= 0.05 - 1e-9
    assert ratio_ci(a, a)[0] == pytest.approx(1.0)
    assert ratio_ci(a[:3], b[:3])[1:] == (None, None)  # 3 runs a side: no 95% interval exists


def _change(name: str, ratio: float, lo: float, hi: float, a_ms: float = 1.0) -> SliceChange:
    return SliceChange(name, a_ms, a_ms * ratio, ratio, lo, hi, moved=lo > 1.05 or hi < 0.95)


def test_readings_on_known_changes() -> None:
    same = [_change(f"layer {i}", 1.0, 0.97, 1.03) for i in range(6)]
    assert layer_reading(same, 0.05).startswith("no layer moved")
    one = [*same[:3], _change("layer 3", 1.4, 1.3, 1.5), *same[4:]]
    assert layer_reading(one, 0.05) == "layer 3 +40.0%, the rest unchanged"
    uniform = [_change(f"layer {i}", 1.8 + 0.02 * i, 1.7, 2.0) for i in range(6)]
    assert layer_reading(uniform, 0.05).startswith("uniform across layers (+8")
    groups = [
        _change(MATMUL, 0.82, 0.8, 0.84, a_ms=10.0),
        _change(ATTENTION, 1.03, 1.0, 1.06),
        _change(ROPE, 1.2, 1.1, 1.3, a_ms=0.1),
    ]
    assert op_reading(groups, []) == "matrix multiplication -18.0%, rope +20.0%"
    gone = SliceChange("FLASH_ATTN_EXT", 0.5, 0.0, None, None, None, moved=True)
    new = SliceChange("SOFT_MAX", 0.0, 0.3, None, None, None, moved=True)
    assert op_reading([], [gone, new]) == "FLASH_ATTN_EXT only in A, SOFT_MAX only in B"


@pytest.fixture(scope="module")
def layer_engines():
    """Six equal blocks (A) and the same model with block 3's FFN 16x as wide (B), 1 thread each."""
    engines = [LlamaCppEngine(ensure_model(spec), threads=1) for spec in (SIX_EQUAL, SLOW_LAYER)]
    yield engines
    for engine in engines:
        engine.close()


def _interleaved(a: LlamaCppEngine, b: LlamaCppEngine, workload: Workload) -> tuple[Attribution, Attribution]:
    """Both passes run by run in seeded AB/BA order, as an A/B runs them."""
    got = interleaved({"A": AttributionPass(a, workload), "B": AttributionPass(b, workload)}, *pass_orders(0))
    return got["A"], got["B"]


@pytest.fixture(scope="module")
def layer_models(layer_engines) -> tuple[Attribution, Attribution]:
    return _interleaved(*layer_engines, dataclasses.replace(WORKLOAD, max_tokens=8))


def test_the_reading_names_the_slowed_layer(layer_models: tuple[Attribution, Attribution]) -> None:
    a, b = layer_models
    change = compare_attributions(a, b, reason="asked", a_name="six-equal", b_name="slow-layer")
    for phase in ("prefill", "decode"):
        ph = change.phase(phase)
        assert ph.reading.startswith("layer 3 +"), ph.reading
        (layer3,) = [c for c in ph.layers if c.name == "layer 3"]
        assert layer3.moved and layer3.ratio is not None and layer3.ratio > 3
        # Layer 3 is named first, and alone unless the wide block's own effect on the next ones
        # stands out (its 16x FFN evicts their weights from the cache: a real, smaller change
        # that 8 runs a side can see on a busy machine).
        others = [c for c in ph.layers if c.name.startswith("layer ") and c.name != "layer 3" and c.name in ph.reading]
        assert all(c.ratio is not None and abs(math.log(c.ratio)) < math.log(layer3.ratio) / 2 for c in others), (
            ph.reading
        )
    # The wider FFN is matrix work. Decode only: a run's prefill is three steps, and on a busy
    # machine the matrix group's total over them can span 1 (the block's own time never did).
    assert "matrix multiplication +" in change.decode.reading, change.decode.reading
    text = change.lines()
    assert all(len(line) <= 80 for line in text), text
    again = AttributionChange.from_json(json.loads(json.dumps(change.to_json())))
    assert again.to_json() == change.to_json()


def test_the_reading_says_uniform_for_threads(small_engine) -> None:
    """1 thread against 2 on the small preset (12 blocks, enough work per node for a thread
    more to show): every block of a decode step changes alike, so no block is named. On a busy
    machine the second thread may gain nothing: then no layer moved, which names none either;
    or, with a core taken by another process, the second thread waits for it at each step's
    first nodes, and that wait lands in the first block (seen: ``layer 0 +3988%`` with the
    machine at load 10): no other block is ever named (docs/attribution.md)."""
    work = Workload(prompt_tokens=32, max_tokens=12, runs=5, warmup=1)
    two = LlamaCppEngine(ensure_model("small"), threads=2)
    try:
        a, b = _interleaved(small_engine, two, work)
    finally:
        two.close()
    change = compare_attributions(a, b, reason="asked", a_name="threads 1", b_name="threads 2")
    reading = change.decode.reading
    assert reading.startswith(("uniform across layers", "no layer moved", "layer 0 ")), reading
    assert not any(f"layer {i} " in reading for i in range(1, 12)), reading


# -- where it runs: an in-process A/B --------------------------------------------------------


def test_an_ab_runs_the_pass_by_itself_when_a_phase_moved(layer_engines) -> None:
    """Not asked for: B (one block 16x wider) spends more time inside llama.cpp in both phases
    (its parts moved: 10 pairs give their paired test its power), so both sides' passes run after
    the pairs, and the A/B's section, JSON and properties say where the time went."""
    from pytest_llmperf.core.documents import validate
    from pytest_llmperf.judge.ab import Side, as_dict, compare_ab, properties

    a, b = layer_engines
    r = compare_ab(Side("six-equal", a), Side("slow-layer", b), Workload(prompt_tokens=32, max_tokens=8, runs=10))
    assert r.decode.ratio > 1.5 and r.attribution is not None, r.lines()
    # B's llama.cpp time moved (both phases on a quiet machine; 10 pairs at load 6 have seen
    # only prefill's decided), so the passes ran by themselves.
    assert r.attribution.reason in {f"llama.cpp's {p} time moved" for p in ("prefill and decode", "prefill", "decode")}
    assert r.attribution.decode.reading.startswith("layer 3 +"), r.attribution.decode.reading
    assert set(r.attribution.sides) == {"A", "B"} and r.attribution.sides["B"]["kv_mib"] > 0
    text = r.lines()
    assert any(line.startswith("where llama.cpp's time went (llama.cpp's prefill and decode") for line in text), text
    assert all(len(line) <= 80 for line in text[text.index(r.attribution.lines()[0]) :])
    doc = as_dict(r)
    assert doc["attribution"]["phases"]["decode"]["reading"] == r.attribution.decode.reading
    validate(doc["attribution"], "session", "attribution", "ab.attribution")
    props = dict(properties([r]))
    assert props["llmperf.ab.attribution.decode"] == r.attribution.decode.reading


def _stream(prompt: str, max_tokens: int):
    yield from ["x"] * max_tokens


def test_an_ab_with_a_callable_side_says_why_there_is_no_pass_only_when_asked(tiny_engine) -> None:
    from pytest_llmperf.judge.ab import Side, compare_ab

    w = Workload(prompt_tokens=8, max_tokens=4, runs=3, warmup=0)
    asked = compare_ab(Side("llama", tiny_engine), Side("stream", _stream), w, agreement=False, attribution=True)
    assert asked.attribution is None
    assert asked.attribution_note == "attribution not run (asked: attribution=True): side B is not in-process llama.cpp"
    assert asked.attribution_note in asked.lines()
    unasked = compare_ab(Side("llama", tiny_engine), Side("stream", _stream), w, agreement=False)
    assert unasked.attribution is None and unasked.attribution_note == ""


# -- where it runs: --llmperf-against's two sides -------------------------------------------

AGAINST_TESTS = """
import pytest
from pick import MODEL


@pytest.mark.llmperf(prompt_tokens=16, max_tokens=8, runs=10, warmup=1)  # 10 pairs: power for the parts
def test_model(llmperf):
    llmperf.measure(model=MODEL)  # the code under test names the model: block 3 16x wider at HEAD
"""


def test_against_runs_the_pass_on_both_sides_when_llama_cpp_moved(tmp_path, tiny_model_path) -> None:
    """REF's model has six equal blocks, HEAD's one 16x wider: the decode time moves, so each
    side runs its pass in its own process after the pairs (not asked for), and the verdict says
    layer 3, in the terminal and the session file (schema-checked on reading)."""
    from test_against import CONFTEST, Runner, make_repo

    from pytest_llmperf.reports.session_file import load_session

    runner = Runner(tmp_path, tiny_model_path)
    root = tmp_path / "repo"
    files = {"conftest.py": CONFTEST, "pick/__init__.py": f"MODEL = {str(ensure_model(SIX_EQUAL))!r}\n"}
    files["tests/test_where.py"] = AGAINST_TESTS
    make_repo(root, [("base", files), ("wider", {"pick/__init__.py": f"MODEL = {str(ensure_model(SLOW_LAYER))!r}\n"})])
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", "git:HEAD~1", "--llmperf-json", "s.json")
    out = inner.out
    (result,) = json.loads((root / "s.json").read_text())["results"]
    where = result["verdict"].get("attribution")
    assert where is not None, out
    assert where["reason"].startswith("llama.cpp's") and where["reason"].endswith("time moved"), where["reason"]
    assert where["a"].startswith("REF git:HEAD~1") and where["b"] == "this tree"
    assert where["phases"]["decode"]["reading"].startswith("layer 3 +"), where["phases"]["decode"]
    assert set(where["cost"]) == {"A", "B"} and where["cost"]["B"]["wall_s"] > 0
    assert "where llama.cpp's time went (llama.cpp's" in out and "decode: layer 3 +" in out, out
    (loaded,) = load_session(root / "s.json")
    assert loaded.verdict is not None and loaded.verdict.attribution is not None
    assert loaded.verdict.attribution.decode.reading == where["phases"]["decode"]["reading"]
    runner.check_clean(root, inner.pids)


# -- where it runs: a stored baseline that has one --------------------------------------------


def test_a_baseline_keeps_the_pass_when_asked_and_compares_it(pytester: pytest.Pytester) -> None:
    """``attribution=True``: the record keeps the pass; the next session on the wider model
    compares its pass with the baseline's and names layer 3."""
    from inner import run as run_inner

    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(attribution=True, max_tokens=8, runs=5, prompt_tokens=32)
        def test_model():
            pass
        """
    )
    run_inner(pytester, "--llmperf-model", str(ensure_model(SIX_EQUAL)), "--llmperf-update-baselines").assert_outcomes(
        passed=1
    )
    (stored,) = [json.loads(p.read_text()) for p in (pytester.path / "baselines").rglob("*.json")]
    (entry,) = [e for test in stored["tests"].values() for e in test.values()]
    assert entry["attribution"]["phases"]["decode"]["layers"], entry.keys()
    result = run_inner(pytester, "--llmperf-model", str(ensure_model(SLOW_LAYER)), "--llmperf-json", "s.json", "-rA")
    (r,) = json.loads((pytester.path / "s.json").read_text())["results"]
    where = r["verdict"]["attribution"]
    assert where["reason"] == "asked: attribution=True" and (where["a"], where["b"]) == ("baseline", "now")
    assert where["phases"]["decode"]["reading"].startswith("layer 3 +"), where["phases"]["decode"]
    assert "decode: layer 3 +" in result.stdout.str()


def test_the_engine_worker_runs_the_pass_in_its_process(tiny_model_path) -> None:
    """The session's default engine is a worker: the pass runs where its model is, and its
    result crosses the pipe whole."""
    from pytest_llmperf.engines.llama_cpp_native import EngineConfig
    from pytest_llmperf.measuring.worker import WorkerEngine

    worker = WorkerEngine(EngineConfig(model=str(tiny_model_path), threads=1))
    try:
        m = measure(worker, Workload(prompt_tokens=8, max_tokens=4, runs=2, warmup=1), attribution=True)
    finally:
        worker.close()
    a = m.attribution
    assert a is not None and a.decode.n_runs == ATTRIBUTION_RUNS and "MUL_MAT" in {s.name for s in a.decode.ops}
    assert [s.name for s in a.decode.layers if s.name.startswith("layer ")] == [f"layer {i}" for i in range(4)]


def test_one_name_for_the_switch_in_marker_and_settings() -> None:
    from pytest_llmperf.core.errors import ConfigError
    from pytest_llmperf.core.settings import SETTINGS
    from pytest_llmperf.session.options import SessionSettings, validate

    assert validate({"attribution": True}).options == {"attribution": True}
    with pytest.raises(ConfigError, match="attribution"):
        validate({"attribution": "yes please"})
    assert SETTINGS["attribution"].option == "--llmperf-attribution" and SETTINGS["attribution"].switch
    assert SessionSettings.of(".", attribution=True).attribution is True
    assert SessionSettings.of(".").attribution is False
