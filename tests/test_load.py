"""Concurrency, Poisson arrivals and goodput, against the real llama.cpp server."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_llmperf import ConfigError, Workload, measure
from pytest_llmperf.cli import main
from pytest_llmperf.measuring.served import arrival_offsets_s, measure_load


def test_poisson_arrivals_are_seeded_with_the_asked_rate():
    a = arrival_offsets_s(4000, rate_per_s=8.0, seed=3)
    assert np.array_equal(a, arrival_offsets_s(4000, rate_per_s=8.0, seed=3))
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert np.diff(a).mean() == pytest.approx(1 / 8.0, rel=0.05)


def test_in_process_engine_refuses_concurrency(tiny_engine):
    with pytest.raises(ConfigError, match="concurrency 2 needs an engine that takes concurrent requests"):
        measure(tiny_engine, Workload(max_tokens=4, requests=2, concurrency=2))


def test_load_distributions_and_goodput(llmperf_server):
    engine = llmperf_server.engine()
    w = Workload(prompt_tokens=8, max_tokens=16, requests=6, concurrency=2, warmup=1)
    m = measure(engine, w, slo={"ttft_ms": 60_000, "tpot_ms": 60_000, "p95_ms": 1})
    s = m.load
    assert (s.n_requests, s.n_ok, s.n_failed, s.concurrency) == (6, 6, 0, 2)
    assert s.slo == {"ttft_ms": 60_000, "tpot_ms": 60_000}  # only TTFT/TPOT are per-request SLOs
    assert s.goodput == 1.0
    assert s.ttft.count == s.tpot.count == s.e2e.count == 6
    assert s.ttft.p50_ms <= s.ttft.p90_ms <= s.ttft.p95_ms <= s.ttft.p99_ms
    assert s.output_tps == pytest.approx(6 * 16 / s.duration_s)
    assert s.requests_per_s == pytest.approx(6 / s.duration_s)
    # An SLO no request can meet: goodput 0.
    strict = measure_load(engine, Workload(prompt_tokens=8, max_tokens=8, requests=2, warmup=0), slo={"ttft_ms": 1e-3})
    assert strict.load.goodput == 0.0


def test_poisson_load_against_the_server(llmperf_server):
    m = measure(llmperf_server.engine(), Workload(prompt_tokens=8, max_tokens=8, requests=4, rate=40.0, warmup=0))
    assert m.load.rate_per_s == 40.0 and m.load.n_ok == 4 and m.load.concurrency == 4


def test_cli_prints_the_latency_throughput_curve(llmperf_server, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # a row per line (at 80 columns its cells wrap: below)
    status = main(
        [
            "load",
            "--endpoint",
            llmperf_server.url,
            "--concurrency",
            "1,2,4",
            "--requests",
            "8",
            "--max-tokens",
            "16",
            "--prompt-tokens",
            "8",
            "--ttft-ms",
            "60000",
            "--tpot-ms",
            "60000",
            "--min-goodput",
            "0.9",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("concurrency"))
    rows = [ln.split() for ln in lines[header + 2 : header + 5]]
    assert [r[0] for r in rows] == ["1", "2", "4"]
    assert all(r[1] == "8/8" and r[-1] == "100%" for r in rows)
    ttft_p50 = [float(r[5]) for r in rows]
    # llama-cpp-python's server runs one request at a time: with 4 in flight, a request
    # waits for others before its first token.
    assert ttft_p50[2] > ttft_p50[0]
    monkeypatch.setenv("COLUMNS", "80")
    args = ["load", "--endpoint", llmperf_server.url, "--concurrency", "1", "--requests", "2", "--max-tokens", "4"]
    assert main([*args, "--prompt-tokens", "8"]) == 0
    narrow = capsys.readouterr().out
    assert all(len(line) <= 80 for line in narrow.splitlines()), narrow


def test_cli_needs_an_endpoint(capsys, monkeypatch):
    monkeypatch.delenv("LLMPERF_ENDPOINT", raising=False)
    assert main(["load"]) == 2
    assert "give --endpoint URL" in capsys.readouterr().err


GOODPUT = """
import pytest

@pytest.mark.llmperf(prompt_tokens=8, max_tokens=8, requests=4, concurrency=2, warmup=0,
                     ttft_ms=60000, tpot_ms=60000, min_goodput=0.95)
def test_meets_slo():
    pass

@pytest.mark.llmperf(prompt_tokens=8, max_tokens=8, requests=4, concurrency=2, warmup=0,
                     ttft_ms=0.001, min_goodput=0.5)
def test_misses_slo():
    pass
"""


def test_goodput_budget_in_the_plugin(pytester, llmperf_server):
    pytester.makepyfile(test_goodput=GOODPUT)
    result = pytester.runpytest_subprocess(f"--llmperf-endpoint={llmperf_server.url}", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*goodput 0 share < budget 0.5 share (4 runs)*"])
    result.stdout.fnmatch_lines(["*goodput*0.0% (ttft_ms <= 0.001)*4 requests*"])
    result.stdout.fnmatch_lines(["test_meets_slo *ok", "*test_misses_slo*FAIL ttft_ms,min_goodput*"])


def test_shared_prefix_needs_a_synthetic_prompt_and_a_server(tiny_engine):
    with pytest.raises(ConfigError, match="shared_prefix_tokens needs a synthetic prompt"):
        Workload(prompt="hello there", shared_prefix_tokens=2)
    with pytest.raises(ConfigError, match=r"shared_prefix_tokens must be between 1 and prompt_tokens - 1 \(7\)"):
        Workload(prompt_tokens=8, shared_prefix_tokens=8)
    with pytest.raises(ConfigError, match="shared_prefix_tokens measures a server's prompt cache"):
        measure(tiny_engine, Workload(prompt_tokens=8, max_tokens=4, runs=1, warmup=0, shared_prefix_tokens=4))


def test_request_bodies_unique_or_sharing_the_asked_prefix():
    from pytest_llmperf.engines.http import HttpEngine

    engine = HttpEngine("http://127.0.0.1:9/v1", prompt_salt=7)
    w = Workload(prompt_tokens=12, max_tokens=4)
    bodies = [engine.body(w, i) for i in range(-3, 20)]
    assert len({b["prompt"] for b in bodies}) == len(bodies) and not any(b["cache_prompt"] for b in bodies)
    other = HttpEngine("http://127.0.0.1:9/v1")  # another engine (salt): other prompts
    assert other.body(w, 0)["prompt"] != engine.body(w, 0)["prompt"]
    shared = [engine.body(Workload(prompt_tokens=12, max_tokens=4, shared_prefix_tokens=8), i) for i in range(5)]
    words = [b["prompt"].split() for b in shared]
    assert all(len(ws) == 12 and ws[:8] == words[0][:8] for ws in words) and all(b["cache_prompt"] for b in shared)
    assert len({" ".join(ws[8:]) for ws in words}) == 5
