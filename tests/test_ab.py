"""Interleaved A/B: paired statistics under simulated machine drift, relative budgets, the
fixture and marker forms on real engines (callables and llama.cpp)."""

from __future__ import annotations

import json
import math
import re
import time

import numpy as np
import pytest
from inner import run

from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.workload import EngineInfo, RunTrace, Workload
from pytest_llmperf.judge.ab import Side, compare_ab
from pytest_llmperf.judge.budgets import parse_budgets
from pytest_llmperf.judge.paired import paired
from pytest_llmperf.measuring.interleave import block_orders
from pytest_llmperf.reports.session_file import load_session


class Machine:
    """A shared machine whose speed drifts over the session: a slow ramp (up to +60%), a
    wave, bursts of a busy neighbour lasting a few runs (x1.5-3), per-run noise (3%) and rare
    outlier runs. Seeded; both sides of an A/B draw from it in the order they run."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.i = 0
        self.burst_left = 0
        self.burst = 1.0

    def factor(self) -> float:
        self.i += 1
        if self.burst_left == 0 and self.rng.random() < 0.04:
            self.burst_left, self.burst = int(self.rng.integers(2, 6)), float(self.rng.uniform(1.5, 3.0))
        burst = self.burst if self.burst_left > 0 else 1.0
        self.burst_left = max(self.burst_left - 1, 0)
        ramp = 1.0 + 0.6 * min(self.i / 80, 1.0)
        wave = 1.0 + 0.15 * math.sin(self.i / 7.0)
        outlier = float(self.rng.uniform(1.3, 2.0)) if self.rng.random() < 0.03 else 1.0
        return ramp * wave * burst * outlier * float(self.rng.lognormal(0.0, 0.03))


class DriftingEngine:
    """Simulated engine on a drifting machine: prefill ``prefill_ms`` and ``token_ms`` per
    generated token at the machine's current speed (clock readings made up, nothing sleeps)."""

    def __init__(self, machine: Machine, prefill_ms: float, token_ms: float, name: str) -> None:
        self.machine, self.prefill_ms, self.token_ms = machine, prefill_ms, token_ms
        self._info = EngineInfo(engine="simulated", model=name)
        self.now = 0

    def info(self) -> EngineInfo:
        return self._info

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        f = self.machine.factor()
        start = self.now
        prefill_done = start + int(self.prefill_ms * f * 1e6)
        stamps = [prefill_done + int(k * self.token_ms * f * 1e6) for k in range(1, workload.max_tokens + 1)]
        self.now = stamps[-1] + 1_000_000
        return RunTrace(start_ns=start, prefill_done_ns=prefill_done, token_ns=tuple(stamps), prompt_tokens=64)


def simulated(seed: int, b_slower: float = 1.0, max_slowdown=0.05, min_speedup=None, runs: int = 20):
    machine = Machine(seed)
    a = DriftingEngine(machine, 100.0, 10.0, "a")
    b = DriftingEngine(machine, 100.0 * b_slower, 10.0 * b_slower, "b")
    return compare_ab(
        Side("a", a),
        Side("b", b),
        Workload(prompt_tokens=64, max_tokens=16, runs=runs, warmup=1, seed=seed),
        max_slowdown=max_slowdown,
        min_speedup=min_speedup,
    )


def test_a_a_under_drift_never_breaks_a_5_percent_budget() -> None:
    """40 sessions of identical sides on a machine that drifts by up to 2.4x inside a session:
    no budget failure, and the paired CIs cover 1 in nearly every session (95% CIs)."""
    results = [simulated(seed) for seed in range(40)]
    assert [r.failure_lines() for r in results if r.failed] == []
    covering = sum(not r.get(p).excludes_one for r in results for p in ("prefill", "decode"))
    assert covering >= 70, covering  # of 80 comparisons (95% CIs; 72 with these seeds)
    # The drift is real: the same runs, unpaired, spread far wider than the pairs do.
    r = results[0]
    a_runs = np.log([x.tpot_ms for x in r.a.runs])
    assert a_runs.std() > 5 * r.decode.spread


def test_a_real_2x_difference_is_found_under_drift_with_a_one_line_failure() -> None:
    for seed in range(20):
        r = simulated(seed, b_slower=2.0)
        for phase in ("prefill", "decode"):
            c = r.get(phase)
            assert c.ci_low > 1.5 and 1.8 < c.ratio < 2.2, (seed, phase, c)
            assert c.p_value < 1e-5  # every pair slower: 2 / 2**20
        assert len(r.failure_lines()) == 2
    line = r.failure_lines()[1]
    assert re.fullmatch(
        r"decode: B \[b\] vs A \[a\]: TPOT B/A 2\.\d{3} \(95% CI 1\.\d{3}\.\.2\.\d{3}, 20 pairs\) vs limit 1\.050: "
        r"breaks max_slowdown 5%",
        line,
    ), line


def test_min_speedup_met_breached_and_undecided() -> None:
    r = simulated(3, b_slower=0.5, max_slowdown=None, min_speedup={"decode": 1.5, "prefill": 3})
    status = {o.budget.target: o.status for o in r.budgets}
    assert status == {"decode": "met", "prefill": "breached"}
    assert re.fullmatch(
        r"prefill: B \[b\] vs A \[a\]: speedup of B over A \d\.\d{3}x \(95% CI \d\.\d{3}\.\.\d\.\d{3}, 20 pairs, "
        r"from TTFT\) vs at least 3x: breaks min_speedup 3x",
        r.failure_lines()[0],
    )
    # 4% slower against a 5% limit: neither shown within nor beyond with these few pairs.
    undecided = simulated(5, b_slower=1.04, runs=5)
    assert {o.status for o in undecided.budgets} <= {"undecided", "met"}
    assert not undecided.failed


def test_block_orders_are_seeded_and_balanced() -> None:
    orders = block_orders(200, seed=7)
    assert orders == block_orders(200, seed=7) != block_orders(200, seed=8)
    assert set(orders) == {"AB", "BA"}
    assert 70 < orders.count("AB") < 130


def test_paired_statistics_on_known_ratios() -> None:
    a = [10.0, 20.0, 40.0, 10.0, 20.0, 40.0]
    c = paired("tpot_ms", a, [2 * v * (1.01 if i % 2 else 0.99) for i, v in enumerate(a)])
    assert c.ratio == pytest.approx(2.0, rel=0.011) and c.ci_low < 2.0 < c.ci_high
    assert c.excludes_one and c.n_pairs == 6
    with pytest.raises(ValueError, match="3 A runs but 2 B runs"):
        paired("tpot_ms", [1, 2, 3], [1, 2])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_slowdown": "5 percent"}, "max_slowdown: expected a share"),
        ({"min_speedup": -1}, "min_speedup must be a factor > 0"),
        ({"max_slowdown": {"decoding": 0.05}}, "unknown phase or metric 'decoding'"),
    ],
)
def test_bad_relative_budgets_say_what_to_do(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_budgets(**kwargs)


def _stream(delay_s: float):
    def fn(prompt: str, max_tokens: int):
        for _ in range(max_tokens):
            time.sleep(delay_s)
            yield "x"

    fn.__name__ = f"sleep_{delay_s * 1e3:g}ms"
    return fn


def test_callable_sides_a_real_2x_difference_is_detected() -> None:
    """Real clocks: a stream twice as slow per token, measured interleaved."""
    r = compare_ab(
        Side("fast", _stream(0.001)),
        Side("slow", _stream(0.005)),
        Workload(prompt_tokens=4, max_tokens=6, runs=8, warmup=1),
        max_slowdown={"decode": 0.2},
    )
    assert r.decode.ci_low > 1.2, r.decode  # sleeping overshoots under load, never halves
    assert [o.status for o in r.budgets] == ["breached"]
    assert r.failure_lines()[0].startswith("decode: B [slow] vs A [fast]: TPOT B/A ")


def test_marker_and_fixture_forms_in_a_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import time
        import pytest

        def fast(prompt, max_tokens):
            for _ in range(max_tokens):
                time.sleep(0.001)
                yield "x"

        def slow(prompt, max_tokens):
            for _ in range(max_tokens):
                time.sleep(0.005)
                yield "x"

        @pytest.mark.llmperf(a=fast, b=slow, max_slowdown={"decode": 0.2}, runs=6, max_tokens=5)
        def test_marker_form():
            pass

        def test_fixture_form(llmperf):
            r = llmperf.compare(a=fast, b=fast, max_slowdown="50%", runs=6, max_tokens=5, label="same")
            assert r.decode.n_pairs == 6 and not r.failed

        @pytest.mark.llmperf(a={"flash_attn": False}, b={"flash_attn": True}, runs=3, prompt_tokens=16, max_tokens=4)
        def test_llama_settings_sides(llmperf):
            pass
        """
    )
    result = run(pytester, "-rA", "--llmperf-json", "session.json")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.re_match_lines(
        [
            r"^decode: B \[slow\] vs A \[fast\]: TPOT B/A \d\.\d{3} \(95% CI \d\.\d{3}\.\.\d\.\d{3}, 6 pairs\) "
            r"vs limit 1\.200: breaks max_slowdown 20%$"
        ]
    )
    out = result.stdout.str()
    assert "A: flash_attn=False" in out and "B: flash_attn=True" in out
    assert re.search(r"3 pairs interleaved \(\d AB, \d BA, seeded\)", out)
    assert "Traceback" not in out
    # A/B comparisons reach the session JSON, under "ab" (not through pytest_llmperf_result).
    assert load_session(pytester.path / "session.json") == []  # the schema allows "ab"; no measure() ran
    ab = {e["test"].split("::")[1]: e for e in json.loads((pytester.path / "session.json").read_text())["ab"]}
    assert set(ab) == {"test_marker_form", "test_fixture_form[same]", "test_llama_settings_sides"}
    marker = ab["test_marker_form"]
    assert (marker["a"]["name"], marker["b"]["name"], len(marker["orders"])) == ("fast", "slow", 6)
    assert [(b["target"], b["status"]) for b in marker["budgets"]] == [("decode", "breached")]
    assert marker["failures"] == [marker["budgets"][0]["line"]]
    decode = next(c for c in marker["comparisons"] if c["metric"] == "tpot_ms")
    assert decode["n_pairs"] == 6 and decode["ratio"] > 1
    assert ab["test_fixture_form[same]"]["label"] == "same" and ab["test_fixture_form[same]"]["failures"] == []


def test_bad_side_fails_collection_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(a={"thread": 2}, b={})
        def test_typo():
            pass
        """
    )
    result = run(pytester)
    result.stdout.fnmatch_lines(["*A/B side 'a': unknown llama.cpp setting 'thread'; did you mean 'threads'? (*"])


def test_signed_rank_p_agrees_with_scipy_exact_and_approximate() -> None:
    from scipy.stats import wilcoxon

    from pytest_llmperf.judge.paired import signed_rank_p

    rng = np.random.default_rng(0)
    for n in (8, 20, 200):
        d = rng.normal(0.01, 0.05, n)
        assert signed_rank_p(d) == pytest.approx(wilcoxon(d).pvalue, rel=0.01, abs=1e-6), n


def test_every_pair_one_way_gives_exact_p_values_up_to_the_cap() -> None:
    """All pairs slower: P(T+ >= max) = 2^-n exactly, for every n the exact null covers. At 60
    pairs ``1 - cdf`` gave -4e-16, and Holm's check ended an --llmperf-against session that took
    its 60-pair cap with an INTERNALERROR (three of ten +8% sessions, 2026-12-02)."""
    from types import SimpleNamespace

    from pytest_llmperf.judge.paired import EXACT_MAX_PAIRS, _signed_rank_greater, judged_pairs, signed_rank_p

    for n in (6, 20, 59, EXACT_MAX_PAIRS):
        d = np.linspace(0.01, 0.2, n)
        assert _signed_rank_greater(d) == pytest.approx(2.0**-n, rel=1e-9), n
        assert signed_rank_p(d) == pytest.approx(2.0 ** (1 - n), rel=1e-9), n
        assert 0.0 <= _signed_rank_greater(-d) <= 1.0

    def runs(ttft: float, tpot: float) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(
                ttft_ms=ttft * (1 + i / 1000),
                tpot_ms=tpot * (1 + i / 997),
                itl_p95_ms=tpot * 1.2,
                prefill_tps=32e3 / ttft,
                decode_tps=1e3 / tpot,
            )
            for i in range(EXACT_MAX_PAIRS)
        ]

    comparisons = judged_pairs(
        runs(9.0, 4.0), runs(10.0, 5.0), alpha=0.01, threshold=0.05, tail_threshold=0.10, family=3, looks=3
    )
    assert {c.metric: c.verdict.value for c in comparisons if c.mirror_of is None}["tpot_ms"] == "REGRESSION"


def test_in_process_against_served_endpoint(llmperf_server, tiny_engine) -> None:
    """A side given as an endpoint URL is measured through the OpenAI-compatible API; the
    server's overhead per token is the decode ratio's distance from 1 (any value is allowed:
    the machine decides; the pairs and the sides are what must be right)."""
    from pytest_llmperf.session.results import resolve_side

    served = resolve_side("b", llmperf_server.url, lambda settings: pytest.fail("no llama.cpp settings here"))
    r = compare_ab(Side("in-process", tiny_engine), served, Workload(prompt_tokens=8, max_tokens=6, runs=4, warmup=1))
    assert r.b_name == llmperf_server.url and r.b.engine.endpoint == llmperf_server.url
    assert r.a.engine.engine == "llama.cpp" and r.decode.n_pairs == 4
    assert r.decode.ci_low <= r.decode.ratio <= r.decode.ci_high
    served.engine.close()


def _pair_runs(rng, n, decode_ratio, prefill_ratio=1.0, drift=0.25, noise=0.03):
    """Per-run metrics of n interleaved pairs: both runs of a pair share a drifting machine level
    (a factor up to e**drift), each has its own small noise; B is slower by the given ratios."""
    from types import SimpleNamespace

    a, b = [], []
    for _ in range(n):
        level = math.exp(rng.normal(0.0, drift))
        for out, dr, pr in ((a, 1.0, 1.0), (b, decode_ratio, prefill_ratio)):
            tpot = 5.0 * level * dr * math.exp(rng.normal(0.0, noise))
            ttft = 40.0 * level * pr * math.exp(rng.normal(0.0, noise))
            out.append(
                SimpleNamespace(
                    ttft_ms=ttft,
                    tpot_ms=tpot,
                    itl_p95_ms=tpot * 1.2,
                    prefill_tps=64 / ttft * 1e3,
                    decode_tps=1e3 / tpot,
                )
            )
    return a, b


def test_judged_pairs_catch_decode_only_and_keep_the_baseline_words() -> None:
    from pytest_llmperf.judge.paired import judged_pairs
    from pytest_llmperf.judge.verdict import Verdict

    rng = np.random.default_rng(7)
    a, b = _pair_runs(rng, 20, decode_ratio=1.08)
    out = {
        c.metric: c
        for c in judged_pairs(
            a, b, alpha=0.05, threshold=0.05, tail_threshold=0.10, family=30, looks=3, reference="git:main (abc)"
        )
    }
    assert out["tpot_ms"].verdict is Verdict.REGRESSION and out["decode_tps"].verdict is Verdict.REGRESSION
    assert out["ttft_ms"].verdict is Verdict.UNCHANGED  # the drift (sd 25%) cancels in each pair
    assert out["tpot_ms"].ci_low > 1.0 and 1.06 < out["tpot_ms"].ratio < 1.10
    line = out["tpot_ms"].line()
    assert "at git:main (abc)" in line and "20 pairs" in line and "baseline" not in line
    assert "interleaved pairs against git:main (abc)" in out["tpot_ms"].reach()


def test_judged_pairs_a_a_under_drift_false_alarms_stay_below_alpha() -> None:
    from pytest_llmperf.judge.paired import judged_pairs
    from pytest_llmperf.judge.verdict import Verdict

    rng = np.random.default_rng(11)
    alarms = 0
    for _ in range(300):
        a, b = _pair_runs(rng, 20, decode_ratio=1.0, drift=0.3, noise=0.06)
        comps = judged_pairs(a, b, alpha=0.05, threshold=0.05, tail_threshold=0.10, family=3, looks=1)
        alarms += any(c.verdict is Verdict.REGRESSION for c in comps)
    assert alarms <= 6  # 2% of 300; expected well under alpha (the threshold on top of the test)


def test_one_sided_signed_rank_p_agrees_with_scipy() -> None:
    from scipy.stats import wilcoxon

    from pytest_llmperf.judge.paired import _signed_rank_greater

    rng = np.random.default_rng(5)
    for n in (6, 15, 40):
        d = rng.normal(0.2, 1.0, size=n)
        assert math.isclose(
            _signed_rank_greater(d), wilcoxon(d, alternative="greater", method="exact").pvalue, rel_tol=1e-9
        )
        assert math.isclose(
            _signed_rank_greater(-d), wilcoxon(-d, alternative="greater", method="exact").pvalue, rel_tol=1e-9
        )


def test_against_keeps_pairing_until_an_unchanged_ci_excludes_one_or_lies_within_the_threshold() -> None:
    """The rule in tests/test_against_stopping.py, on the pairs this file makes."""
    from pytest_llmperf.judge.paired import judged_pairs, needs_more_pairs
    from pytest_llmperf.judge.verdict import Verdict

    def tpot(a, b):
        return {x.metric: x for x in judged_pairs(a, b, alpha=0.05, threshold=0.05, tail_threshold=0.1, family=3)}[
            "tpot_ms"
        ]

    rng = np.random.default_rng(2)
    wide = None
    for _ in range(200):  # a noisy A/A: some come out UNCHANGED with a CI that holds 1 and reaches past 5%
        c = tpot(*_pair_runs(rng, 20, decode_ratio=1.0, drift=0.2, noise=0.08))
        if c.verdict is Verdict.UNCHANGED and c.ci_low < 1 < c.ci_high and not 1 / 1.05 < c.ci_low < c.ci_high < 1.05:
            wide = c
    assert wide is not None and needs_more_pairs(wide)
    narrow = tpot(*_pair_runs(rng, 20, decode_ratio=1.0, drift=0.2, noise=0.02))  # CI within +-5%: it stands
    assert narrow.verdict is Verdict.UNCHANGED and 1 / 1.05 < narrow.ci_low < 1 < narrow.ci_high < 1.05
    assert needs_more_pairs(narrow) is None
    found = tpot(*_pair_runs(rng, 40, decode_ratio=1.03, drift=0.2, noise=0.01))  # +3%: shown, within 5%
    assert found.verdict is Verdict.UNCHANGED and found.ci_low > 1 and needs_more_pairs(found) is None
    regression = tpot(*_pair_runs(rng, 40, decode_ratio=1.10, drift=0.2, noise=0.01))
    assert regression.verdict is Verdict.REGRESSION and needs_more_pairs(regression) is None
