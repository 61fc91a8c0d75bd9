"""Output agreement of an A/B's sides on real llama.cpp: A/A exactly 1 and 0, a model with other
weights near chance and caught by min_top1_agreement, F16 against Q8_0 close but not equal, a
callable side not available (and a budget on it fails), computed after every timed run; the
marker form in an inner session: the failure line, the report section within 80 columns, the
session JSON against its schema, the JUnit properties, the Markdown summary and the HTML report."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from inner import run

from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.workload import Workload
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine
from pytest_llmperf.judge.ab import Side, compare_ab
from pytest_llmperf.measuring.agreement import compare_outputs, kl_rows, log_softmax
from pytest_llmperf.models.gguf import PRESETS, ModelSpec, ensure_model
from pytest_llmperf.reports.session_file import load_session

#: A shape Q8_0 can store (n_embd and n_ff divisible by 32), fast as the tiny preset.
SHAPE = {"n_layer": 2, "n_embd": 128, "n_ff": 256, "n_head": 4, "n_head_kv": 2}
WORKLOAD = Workload(prompt_tokens=12, max_tokens=16, runs=3, warmup=0)


@pytest.fixture(scope="module")
def other_seed_path() -> Path:
    """The tiny preset's shape with other weights."""
    import dataclasses

    return ensure_model(dataclasses.replace(PRESETS["tiny"], seed=1))


@pytest.fixture(scope="module")
def f16_and_q8(tiny_model_path: Path):
    """One model in F16 and in Q8_0 (the same seeded weights, quantized two ways); Q8_0 without
    repacking (the AMX kernel crashes on this machine's CPU)."""
    f16 = LlamaCppEngine(ensure_model(ModelSpec(name="agree", dtype="F16", **SHAPE)), threads=1)
    q8 = LlamaCppEngine(ensure_model(ModelSpec(name="agree", dtype="Q8_0", **SHAPE)), threads=1, repack=False)
    yield f16, q8
    f16.close()
    q8.close()


def _stream(prompt: str, max_tokens: int):
    yield from ["x"] * max_tokens


def test_kl_of_identical_logits_is_exactly_zero_and_positive_otherwise() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 300)).astype(np.float32)
    assert kl_rows(logits, logits.copy()).tolist() == [0.0] * 5
    other = logits + rng.normal(scale=0.1, size=logits.shape).astype(np.float32)
    kl = kl_rows(logits, other)
    assert (kl > 0).all()
    # Against the definition, sum p_a (log p_a - log p_b), from scratch.
    pa = np.exp(logits[0].astype(np.float64)) / np.exp(logits[0].astype(np.float64)).sum()
    pb = np.exp(other[0].astype(np.float64)) / np.exp(other[0].astype(np.float64)).sum()
    assert kl[0] == pytest.approx(float((pa * np.log(pa / pb)).sum()), rel=1e-9)
    assert np.exp(log_softmax(logits)).sum(axis=1) == pytest.approx(np.ones(5))


def _top_k(t, k: int):
    """The same outputs as a served side reports them: the top-k log-probabilities only."""
    from pytest_llmperf.core.workload import TokenLogits

    full = log_softmax(t.logits)
    ids = np.argsort(-full, axis=1)[:, :k]
    return TokenLogits(t.prompt_ids, t.greedy_ids, None, ids, np.take_along_axis(full, ids, axis=1))


def test_top_k_kl_is_a_lower_bound_and_zero_for_the_same_distribution() -> None:
    from pytest_llmperf.core.workload import TokenLogits
    from pytest_llmperf.measuring.agreement import approx_kl_rows

    rng = np.random.default_rng(1)
    la = (rng.normal(size=(6, 400)) * 2).astype(np.float32)
    lb = la + rng.normal(scale=0.3, size=la.shape).astype(np.float32)
    a, b = (TokenLogits((1,), (0,) * 6, x) for x in (la, lb))
    exact = kl_rows(la, lb)
    for one, other in ((_top_k(a, 20), b), (a, _top_k(b, 20)), (_top_k(a, 20), _top_k(b, 20))):
        approx, same = approx_kl_rows(one, other)
        assert (approx <= exact + 1e-12).all() and (approx > 0).all()
        assert same.tolist() == (np.argmax(la, axis=1) == np.argmax(lb, axis=1)).tolist()
    approx, same = approx_kl_rows(_top_k(a, 20), a)
    assert approx.tolist() == [0.0] * 6 and same.all()


def test_a_a_agrees_exactly(tiny_model_path: Path, tiny_engine) -> None:
    """Two engines of one setting, each on its own context: identical logits, KL exactly 0."""
    other = LlamaCppEngine(tiny_model_path, threads=1)
    try:
        g = compare_outputs(tiny_engine, other, WORKLOAD)
    finally:
        other.close()
    assert g.available and g.method == "exact, full vocabulary"
    assert (g.n_prompts, g.n_positions) == (4, 64)
    assert g.top1_agreement == 1.0 and g.greedy_parity == 1.0
    assert g.kl_mean == 0.0 and g.kl_p99 == 0.0 and g.kl_max == 0.0
    assert g.first_divergence == (None,) * 4


def test_greedy_ids_are_what_the_engine_generates(tiny_engine) -> None:
    """The greedy continuation is the one the runs' sampler draws (sample=True engine)."""
    sampling = LlamaCppEngine(tiny_engine.info().model_path, threads=1, sample=True)
    try:
        w = Workload(prompt_tokens=12, max_tokens=16, runs=1, warmup=0)
        got = sampling.token_logits(w)
        trace = sampling.run(w, 0)
    finally:
        sampling.close()
    assert got.greedy_ids == trace.token_ids
    assert got.logits.shape == (16, tiny_engine.n_vocab) and got.logits.dtype == np.float32
    # Teacher-forced on its own greedy ids, the top token of each row is the greedy one.
    assert (np.argmax(got.logits, axis=1) == np.array(got.greedy_ids)).mean() >= 0.9


def test_other_weights_agree_near_chance_and_fail_min_top1_agreement(tiny_engine, other_seed_path: Path) -> None:
    other = LlamaCppEngine(other_seed_path, threads=1)
    try:
        r = compare_ab(Side("seed0", tiny_engine), Side("seed1", other), WORKLOAD, min_top1_agreement=0.9)
    finally:
        other.close()
    g = r.agreement
    assert g is not None and g.available
    assert g.top1_agreement is not None and g.top1_agreement < 0.2, g  # chance: 1 / 512 per position
    assert g.kl_mean is not None and g.kl_mean > 0.01
    assert g.earliest_divergence is not None and g.earliest_divergence < 16
    assert [o.status for o in r.agreement_budgets] == ["breached"]
    (line,) = r.failure_lines()
    assert re.fullmatch(
        r"top-1 agreement of B \[seed1\] with A \[seed0\] 0\.\d{4} < min_top1_agreement 0\.9 "
        r"\(64 positions over 4 prompts\)",
        line,
    ), line


def test_f16_against_q8_0_is_close_but_not_identical(f16_and_q8) -> None:
    f16, q8 = f16_and_q8
    r = compare_ab(Side("f16", f16), Side("q8_0", q8), WORKLOAD, min_top1_agreement=0.5, max_kl=0.05)
    g = r.agreement
    assert g is not None and g.available
    assert g.kl_mean is not None and 0.0 < g.kl_mean < 0.05, g
    assert g.kl_p99 is not None and g.kl_max is not None and g.kl_mean <= g.kl_max and g.kl_p99 <= g.kl_max
    assert g.top1_agreement is not None and g.top1_agreement >= 0.5, g
    assert [o.status for o in r.agreement_budgets] == ["met", "met"] and not r.failed
    assert any(line.startswith("mean KL(A||B) of B [q8_0] with A [f16] ") for line in r.lines())


def test_a_callable_side_reports_not_available_and_a_budget_on_it_fails(tiny_engine) -> None:
    r = compare_ab(Side("llama", tiny_engine), Side("stream", _stream), WORKLOAD)
    assert r.agreement is not None and not r.agreement.available
    assert "agreement: not available (side B [stream] exposes no token probabilities)" in r.lines()
    assert not r.failed  # no budget: shown, does not fail
    r = compare_ab(Side("llama", tiny_engine), Side("stream", _stream), WORKLOAD, max_kl=0.01)
    assert r.failure_lines() == [
        "max_kl 0.01: B [stream] vs A [llama]: agreement not available (side B [stream] exposes no token probabilities)"
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_top1_agreement": 1.5}, "min_top1_agreement must be a share between 0 and 1"),
        ({"max_kl": -1}, "max_kl must be a number >= 0"),
        ({"max_kl_p99": "0.1"}, "max_kl_p99 must be a number >= 0"),
    ],
)
def test_bad_agreement_budgets_say_what_to_do(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        compare_ab(Side("a", _stream), Side("b", _stream), WORKLOAD, **kwargs)


class Recording(LlamaCppEngine):
    """The real engine, with the order of its runs and token-probability reads written down."""

    events: list[str]

    def run(self, workload, run_index):
        self.events.append("run")
        return super().run(workload, run_index)

    def token_logits(self, workload, forced=None):
        self.events.append("logits")
        return super().token_logits(workload, forced)


def test_agreement_is_computed_after_every_timed_run(tiny_model_path: Path) -> None:
    a, b = Recording(tiny_model_path, threads=1), Recording(tiny_model_path, threads=1)
    a.events, b.events = [], []
    try:
        r = compare_ab(Side("a", a), Side("b", b), Workload(prompt_tokens=8, max_tokens=6, runs=4, warmup=1))
        for events in (a.events, b.events):
            assert events == ["run"] * 5 + ["logits"] * 4  # 1 warm-up + 4 runs, then 4 prompts
        assert r.a.n_runs == r.b.n_runs == 4 and len(r.a.warmup_runs) == 1
        assert r.agreement is not None and r.agreement.kl_mean == 0.0
        r = compare_ab(Side("a", a), Side("b", _stream), Workload(max_tokens=4, runs=3), agreement=False)
        assert r.agreement is None and not any(line.startswith("agreement") for line in r.lines())
        assert a.events[9:] == ["run"] * 4  # its warm-up and 3 runs; nothing read untimed
    finally:
        a.close()
        b.close()


def test_marker_form_fails_with_one_line_and_reports_everywhere(pytester: pytest.Pytester, other_seed_path) -> None:
    """Worker engines (the plugin's default): the logits cross the worker's pipe."""
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf(a={{"model": "tiny"}}, b={{"model": {str(other_seed_path)!r}}},
                             min_top1_agreement=0.9, runs=3, warmup=0, prompt_tokens=8, max_tokens=8)
        def test_other_weights():
            pass

        @pytest.mark.llmperf(a={{"model": "tiny"}}, b={{"model": "tiny"}}, max_kl=0.0, max_kl_p99=0.0,
                             min_top1_agreement=1.0, runs=3, warmup=0, prompt_tokens=8, max_tokens=8)
        def test_same():
            pass
        """
    )
    result = run(pytester, "-rA", "--llmperf-json", "session.json", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    name = str(other_seed_path)
    result.stdout.re_match_lines(
        [
            rf"^top-1 agreement of B \[model={re.escape(name)}\] with A \[model=tiny\] 0\.\d{{4}} < min_top1_agreement 0\.9 \(32 positions over 4 prompts\)$"
        ]
    )
    # The agreement block (budget lines name the sides, which may be as long as a path).
    block = [line for line in out.splitlines() if line.startswith(("agreement", "  teacher", "  KL", "  greedy"))]
    assert len(block) == 8 and all(len(line) <= 80 for line in block), block
    assert "KL(A||B) mean 0, p99 0, max 0" in out and "Traceback" not in out
    assert load_session(pytester.path / "session.json") == []  # validates against the schema
    ab = {e["test"].split("::")[1]: e for e in json.loads((pytester.path / "session.json").read_text())["ab"]}
    same, other = ab["test_same"], ab["test_other_weights"]
    assert same["agreement"]["kl_mean"] == 0.0 and same["agreement"]["top1_agreement"] == 1.0
    assert [b["status"] for b in same["agreement_budgets"]] == ["met"] * 3
    assert other["agreement"]["n_positions"] == 32 and other["agreement"]["top1_agreement"] < 0.5
    assert other["failures"] == [b["line"] for b in other["agreement_budgets"]]
    props = {
        (case.get("name"), p.get("name")): p.get("value")
        for case in ET.parse(pytester.path / "junit.xml").iter("testcase")
        for p in case.iter("property")
    }
    assert props[("test_same", "llmperf.ab.agreement.kl_mean")] == "0.0"
    assert props[("test_same", "llmperf.ab.budget.max_kl")] == "met"
    assert props[("test_other_weights", "llmperf.ab.budget.min_top1_agreement")] == "breached"


def test_a_served_side_without_token_id_prompts_is_not_available(llmperf_server, tiny_engine) -> None:
    """llama-cpp-python's server takes no prompt of token ids: agreement says so in one line."""
    from pytest_llmperf.session.results import resolve_side

    served = resolve_side("b", llmperf_server.url, lambda settings: pytest.fail("no llama.cpp settings here"))
    try:
        r = compare_ab(Side("in-process", tiny_engine), served, WORKLOAD)
    finally:
        served.engine.close()
    assert r.agreement is not None and not r.agreement.available
    (line,) = [x for x in r.lines() if x.startswith("agreement")]
    assert line.startswith(f"agreement: not available (side B [{llmperf_server.url}]: the endpoint "), line


def test_llama_server_side_is_approximated_from_its_top_k(llama_server_binary, tiny_engine, other_seed_path) -> None:
    """llama-server's n_probs: the same model served agrees with the in-process one (top-k KL
    near 0), other weights served do not; teacher forcing holds across the divergences."""
    from pytest_llmperf.engines.http import TOP_K, HttpEngine
    from pytest_llmperf.engines.servers import serve_llama_server

    for path, same in ((tiny_engine.info().model_path, True), (other_seed_path, False)):
        with serve_llama_server(path, parallel=1, threads=1) as server:
            served = HttpEngine(server.url)
            try:
                g = compare_outputs(tiny_engine, served, WORKLOAD, b_name=server.url)
                back = compare_outputs(served, tiny_engine, WORKLOAD, a_name=server.url)
            finally:
                served.close()
        for x in (g, back):
            assert x.available, x.reason
            assert x.method == f"approx (top-k={TOP_K})" and x.n_prompts == 4
            # llama-server holds back the probabilities of a byte token that leaves the text an
            # incomplete UTF-8 character (half the tiny vocabulary is byte tokens): left out, counted.
            assert x.n_positions + x.n_unscored == 64 and x.n_positions >= 32, x
            assert x.kl_mean is not None and x.top1_agreement is not None
            if same:
                assert x.kl_mean < 1e-3 and x.top1_agreement >= 0.9, x
            else:
                assert x.kl_mean > 1e-3 and x.top1_agreement < 0.2, x


def test_smoke_runs_compute_no_agreement_and_judge_no_agreement_budget(pytester: pytest.Pytester) -> None:
    """--llmperf-disable: one pair's worth of runs, no budgets, and no agreement either."""
    pytester.makepyfile(
        """
        import pytest

        def stream(prompt, max_tokens):
            yield from ["x"] * max_tokens

        @pytest.mark.llmperf(a={"model": "tiny"}, b=stream, min_top1_agreement=0.9, max_tokens=4)
        def test_smoke():
            pass
        """
    )
    result = run(pytester, "-rA", "--llmperf-disable")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "3 pairs interleaved" in out
    assert "agreement:" not in out and "agreement (" not in out and "min_top1_agreement" not in out


def test_markdown_and_html_show_each_ab_with_its_agreement(pytester: pytest.Pytester, other_seed_path) -> None:
    """An A/B-only session: the Markdown summary and the HTML page (and ``llmperf report`` from
    the session JSON, the same section) show every A/B's ratios, agreement and budgets: other
    weights breach min_top1_agreement, A/A is 1 and 0, a callable side (named with ``<`` and
    ``&``, escaped in the page) is not available."""
    from pytest_llmperf.cli import main as cli_main
    from pytest_llmperf.reports.html import ab_section

    pytester.makepyfile(
        f"""
        import pytest

        def stream(prompt, max_tokens):
            yield from ["x"] * max_tokens

        stream.__name__ = "<stream&co>"
        KEYS = dict(runs=3, warmup=0, prompt_tokens=8, max_tokens=8)

        @pytest.mark.llmperf(a={{"model": "tiny"}}, b={{"model": {str(other_seed_path)!r}}},
                             min_top1_agreement=0.9, **KEYS)
        def test_other_weights():
            pass

        @pytest.mark.llmperf(a={{"model": "tiny"}}, b={{"model": "tiny"}}, max_kl=0.0, **KEYS)
        def test_same():
            pass

        @pytest.mark.llmperf(a={{"model": "tiny"}}, b=stream, max_slowdown={{"decode": 9}}, **KEYS)
        def test_callable():
            pass
        """
    )
    result = run(pytester, "--llmperf-json", "s.json", "--llmperf-markdown", "s.md", "--llmperf-html", "s.html")
    result.assert_outcomes(passed=2, failed=1)
    md = (pytester.path / "s.md").read_text()
    assert "**1 of 3 A/B comparison(s) failed a budget**" in md
    sections = {part.split("`")[1].split("::")[1]: part for part in md.split("#### ")[1:]}
    other, same, called = sections["test_other_weights"], sections["test_same"], sections["test_callable"]
    name = str(other_seed_path)
    assert other.split("\n")[0].endswith(f"::test_other_weights`: B [model={name}] vs A [model=tiny]"), other
    assert re.search(
        r"^\| decode TPOT \(ms\) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+\.\.[\d.]+ \| ", other, re.MULTILINE
    ), other
    assert "| method | exact, full vocabulary |" in other and "| sample | 32 positions over 4 prompts |" in other
    top1 = float(re.search(r"^\| top-1 agreement [^|]*\| (0\.\d{4}) \|$", other, re.MULTILINE).group(1))
    assert top1 < 0.5
    breach = (
        rf"top-1 agreement of B \[model={re.escape(name)}\] with A \[model=tiny\] 0\.\d{{4}} < min_top1_agreement 0\.9"
    )
    assert re.search(rf"^- \*\*FAIL\*\* {breach} \(32 positions over 4 prompts\)$", other, re.MULTILINE), other
    assert "| top-1 agreement (teacher-forced on A's tokens) | 1.0000 |" in same
    assert "| KL(A\\|\\|B) mean | 0 |" in same and "| greedy parity | 1.0000 |" in same
    assert "| first divergence | none |" in same and re.search(
        r"^- mean KL\(A\|\|B\) .* 0 <= max_kl 0 .*: met$", same, re.MULTILINE
    )
    assert "B [<stream&co>] vs A [model=tiny]" in called
    assert "| agreement | not available: side B [<stream&co>] exposes no token probabilities |" in called
    assert "decode TPOT" in called and "max_slowdown met" in called
    page = (pytester.path / "s.html").read_text()
    assert "&lt;stream&amp;co&gt;" in page and "<stream&co>" not in page
    assert page.count('class="ab"') == 3 and page.count('data-state="FAIL"') == 1
    assert "<td>KL(A||B) mean</td><td>0</td>" in page and "<td>greedy parity</td><td>1.0000</td>" in page
    assert "not available: side B [&lt;stream&amp;co&gt;] exposes no token probabilities" in page
    assert re.search(rf"FAIL</span> {breach.replace('<', '&lt;')} ", page)
    # Rendered from what the session keeps: the session JSON's entries give the same section.
    kept = json.loads((pytester.path / "s.json").read_text())["ab"]
    assert ab_section(kept) in page
    assert cli_main(["report", str(pytester.path / "s.json"), "-o", str(pytester.path / "r.html"), "--jobs", "1"]) == 0
    assert ab_section(kept) in (pytester.path / "r.html").read_text()
