"""llama.cpp's own llama-server (built from the installed llama-cpp-python's sources): load with
continuous batching, its per-request timings and /metrics beside our clock, no prompt-cache
illusions, and no server left behind.

Timing ratios are not asserted (the machine is shared): counts are, including llama-server's
own count of the prompt tokens it evaluated (``timings.prompt_n``), which says whether a cache
answered part of a prompt.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from inner import ctrl_c_default

from pytest_llmperf import Workload, measure
from pytest_llmperf.cli import main
from pytest_llmperf.measuring.served import measure_load
from pytest_llmperf.reports.text import load_rows

pytestmark = pytest.mark.usefixtures("llama_server_binary")


@pytest.fixture(scope="module")
def small_server():
    """The small preset (a 32000-token vocabulary), served with 4 slots."""
    from pytest_llmperf import ensure_model
    from pytest_llmperf.engines.servers import serve_llama_server

    with serve_llama_server(ensure_model("small"), parallel=4, threads=1) as server:
        yield server


def test_plugin_fixture_serves_the_session_model(llmperf_llama_server):
    import httpx

    server = llmperf_llama_server
    assert server.kind == "llama-server" and server.parallel == 4 and server.threads == 1
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200
    assert server.engine().server_metrics()["requests_processing"] == 0


def test_load_with_server_timings_and_metrics(small_server, capsys):
    server = small_server
    engine = server.engine()
    w = Workload(prompt_tokens=24, max_tokens=16, requests=8, concurrency=4, warmup=1)
    m = measure(engine, w, slo={"ttft_ms": 60_000, "tpot_ms": 60_000})
    s = m.load
    assert (s.n_ok, s.n_failed, s.concurrency, s.goodput) == (8, 0, 4, 1.0), s.errors
    assert m.engine.token_count == "usage" and m.output_tokens == 16
    # The server's own clock per request (timings), as the in-process engine's llama.cpp counters.
    assert m.native_prefill_ms is not None and m.native_decode_ms_per_token is not None
    side = s.server
    assert side.n_timed == 8
    # Unique prompts, cache_prompt=false: the server evaluated every prompt token of every request.
    assert side.prompt_tokens_from_cache == 0 and side.prompt_n_min >= 24
    assert side.ttft_gap_ms_p50 is not None and side.tpot_gap_ms_p50 is not None
    # /metrics over the level (warm-up excluded): exactly what was asked for.
    assert side.metrics["tokens_predicted_total"] == 8 * 16
    assert side.metrics["prompt_tokens_total"] == sum(r.prompt_tokens for r in m.runs)
    assert side.metrics["prompt_tokens_cached_total"] == 0
    assert side.tokens_per_decode >= 1.0
    from pytest_llmperf.reports.text import metrics_table

    assert re.search(
        r"^prompt cache +unique prompts, prompt cache off \(cache_prompt=false\)", metrics_table(m), re.MULTILINE
    )
    labels = [row[0] for row in load_rows(m)]
    for label in (
        "client TTFT - server prompt time p50",
        "client TPOT - server time per token p50",
        "server /metrics: tokens per decode call",
    ):
        assert label in labels
    with capsys.disabled():
        print(
            f"\nllama-server, concurrency 4: {side.tokens_per_decode:.2f} tokens per decode call, "
            f"TTFT - server prompt {side.ttft_gap_ms_p50:.2f} ms, TPOT - server {side.tpot_gap_ms_p50:.3f} ms/token"
        )


def test_a_served_measurements_parts_are_the_servers_timings_and_the_rest(small_server):
    """One request at a time: llama-server's own timings (prompt_ms, predicted_ms / predicted_n)
    are llama.cpp's parts of TTFT and TPOT; the rest (queue, network, the client) is the part
    outside llama.cpp, and the parts add up to what the client saw."""
    from pytest_llmperf.measuring.metrics import run_metrics
    from pytest_llmperf.reports.text import metrics_table

    engine = small_server.engine()
    w = Workload(prompt_tokens=24, max_tokens=16, runs=3, warmup=1)
    engine.run(w, -1)
    for i in range(w.runs):
        trace = engine.run(w, i)
        native, r = trace.native, run_metrics(trace)
        assert native is not None and native.source == "llama-server timings"
        assert native.prefill_tokens >= 24 and native.decode_tokens == 16  # no prompt cache, every token
        assert r.native_prefill_ms == native.prefill_ms > 0
        assert r.native_decode_ms_per_token == pytest.approx(native.decode_ms / 16) and native.decode_ms > 0
        assert r.sampling_ms_per_token is None  # inside the server's predicted time
        assert r.prefill_outside_ms is not None and r.decode_outside_ms_per_token is not None
        assert r.tokenize_ms + r.native_prefill_ms + r.prefill_outside_ms == pytest.approx(r.ttft_ms, abs=1e-9)
        assert r.native_decode_ms_per_token + r.decode_outside_ms_per_token == pytest.approx(r.tpot_ms, abs=1e-9)
    text = metrics_table(measure(engine, w))
    for row in ("prefill (llama.cpp) median", "prefill outside llama.cpp median", "decode outside llama.cpp median"):
        assert row in text
    assert "parts: not measured" not in text and "not reported: inside the server's time" in text


def test_shared_prefix_is_measured_only_when_asked(small_server, capsys):
    """TTFT without and with a shared prompt prefix: what the plugin says it measured, and
    what llama-server says it evaluated."""
    engine = small_server.engine()
    unique = measure_load(engine, Workload(prompt_tokens=64, max_tokens=16, requests=6, concurrency=1, warmup=0))
    shared = measure_load(
        engine, Workload(prompt_tokens=64, max_tokens=16, requests=6, concurrency=1, warmup=0, shared_prefix_tokens=48)
    )
    assert unique.load.prompt_cache == "unique prompts, prompt cache off (cache_prompt=false)"
    assert shared.load.prompt_cache == "shared 48-token prefix, prompt cache on (measures prefix caching)"
    assert "(48 shared)" in shared.workload.describe()
    u, s = unique.load.server, shared.load.server
    assert u.prompt_tokens_from_cache == 0 and u.metrics["prompt_tokens_cached_total"] == 0
    assert s.prompt_tokens_median == pytest.approx(u.prompt_tokens_median, rel=0.25)  # prompts of a length
    # The first request fills a slot's cache; later ones evaluate only what follows the prefix
    # (48 of 64 words: well over half of the prompt's tokens).
    assert s.prompt_n_max > s.prompt_n_min and s.prompt_n_min < 0.5 * s.prompt_tokens_median
    assert s.prompt_tokens_from_cache > 0 and s.metrics["prompt_tokens_cached_total"] > 0
    with capsys.disabled():
        print(
            f"\nTTFT p50 unique prompts {unique.load.ttft.p50_ms:.2f} ms (server evaluated {u.prompt_n_median:.0f} "
            f"tokens); shared 48-word prefix {shared.load.ttft.p50_ms:.2f} ms (evaluated {s.prompt_n_median:.0f})"
        )


def test_sweep_levels_never_repeat_a_prompt(small_server):
    from pytest_llmperf.measuring.served import sweep

    engine = small_server.engine()
    levels = sweep(engine, Workload(prompt_tokens=16, max_tokens=16, requests=4, warmup=1), (1, 2))
    for m in levels:  # the second level's prompts are new to the server, too
        assert m.load.server.metrics["prompt_tokens_cached_total"] == 0
    bodies = [engine.body(levels[0].workload, i)["prompt"] for i in range(-2, 10)]
    assert len(set(bodies)) == len(bodies)


def test_cli_serve_starts_llama_server(capsys, monkeypatch):
    """Every request succeeds: the embedded model never emits a non-ASCII byte token (its
    output rows are zero), so llama-server, which holds back text that is not yet whole UTF-8,
    streams every token as it is made."""
    monkeypatch.setenv("COLUMNS", "1000")  # its lines read whole (tests/test_report_width.py checks 80)
    status = main(
        [
            "load",
            "--serve",
            "small",
            "--threads",
            "1",
            "--concurrency",
            "1,2",
            "--requests",
            "4",
            "--max-tokens",
            "16",
            "--prompt-tokens",
            "8",
            "--tpot-ms",
            "60000",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "with llama-server at http://127.0.0.1:" in out and "4 slot(s)" in out
    assert "llmperf load: unique prompts, prompt cache off (cache_prompt=false)" in out
    levels = re.findall(r"^([12]) +(\d)/4 ", out, re.MULTILINE)
    assert [level for level, _ in levels] == ["1", "2"], out
    assert [ok for _, ok in levels] == ["4", "4"], out
    assert not re.findall(r"^request \d+: (.*)$", out, re.MULTILINE), out
    assert "server side, concurrency 2: server evaluated" in out


STARTER = """
import sys, time
from pytest_llmperf.engines.servers import serve_llama_server
with serve_llama_server(sys.argv[1], parallel=1, threads=1, build=False) as server:
    print(server.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_no_server_outlives_its_starter(tiny_model_path, how):
    """Killed outright (SIGKILL: Linux's parent-death signal) or interrupted (Ctrl-C)."""
    if how == "SIGKILL" and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux only")
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tiny_model_path)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_default,  # noqa: PLW1509  (the caller's shell may ignore SIGINT)
    )
    try:
        pid = int(proc.stdout.readline())
        os.kill(pid, 0)  # running
        proc.send_signal(getattr(signal, how))
        proc.wait(30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if _zombie(pid):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"llama-server {pid} outlived its starter ({how})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


LOAD_CURVE = """
import pytest

@pytest.mark.parametrize("c", [1, 2])
def test_curve(llmperf, c):
    llmperf.measure(prompt_tokens=8, max_tokens=16, requests=4, concurrency=c, warmup=0)
"""


def test_html_report_draws_the_throughput_latency_curve(pytester, small_server):
    pytester.makepyfile(test_curve=LOAD_CURVE)
    result = pytester.runpytest_subprocess(
        f"--llmperf-endpoint={small_server.url}", "--llmperf-html=report.html", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=2)
    page = (pytester.path / "report.html").read_text()
    assert page.count('data-figure="load-curve"') == 1
    assert "Throughput vs time to first token" in page
    result.stdout.fnmatch_lines(
        [
            "llmperf: prompt cache: every request's prompt unique, cache_prompt=false; tests "
            "with shared_prefix_tokens measure prefix caching (cache_prompt=true)"
        ]
    )
