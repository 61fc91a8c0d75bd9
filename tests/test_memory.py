"""Memory and model-load figures on real llama.cpp (the tiny preset): each from its most direct
source, equal to what llama.cpp itself reports; budgets on them; cold loads labelled cold only
when the eviction took; the memory rule against a baseline."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import TEST_THREADS
from inner import run

from pytest_llmperf import LlamaCppEngine, Workload, measure
from pytest_llmperf.baselines.records import stored
from pytest_llmperf.core.fingerprint import Fingerprint, subject
from pytest_llmperf.core.measurement import COLD_RESIDENT_MAX, Measurement
from pytest_llmperf.judge.regression import MEMORY_RULE, compare_memory
from pytest_llmperf.measuring.runner import evict, read_through, resident_share, with_model_loads

FAST = "max_tokens=4, runs=2, warmup=0, prompt_tokens=8"


def _llama_cpp_reports(path: str, n_ctx: int, n_batch: int, n_ubatch: int, flash_attn: bool) -> dict[str, float]:
    """The buffer sizes llama.cpp prints for a context of these sizes, in a process of its own
    (``verbose=True``): MiB by kind, read with a pattern of this test's own."""
    code = (
        "import llama_cpp, sys; llama_cpp.Llama(sys.argv[1], n_ctx=int(sys.argv[2]), n_batch=int(sys.argv[3]), "
        "n_ubatch=int(sys.argv[4]), flash_attn=sys.argv[5] == 'True', n_threads=1, verbose=True)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, path, str(n_ctx), str(n_batch), str(n_ubatch), str(flash_attn)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stderr
    sizes: dict[str, float] = {}
    for kind, mib in re.findall(r"(KV|compute|model) buffer size =\s+([\d.]+) MiB", out):
        sizes[kind] = sizes.get(kind, 0.0) + float(mib)
    assert {"KV", "compute", "model"} <= sizes.keys(), out[-2000:]
    return sizes


def test_buffer_sizes_are_summed_per_kind_from_llama_cpps_log_pieces() -> None:
    """The log arrives in pieces (llama.cpp continues a line with GGML_LOG_LEVEL_CONT); a kind
    held by two backends (CPU_Mapped and AMX weights, here the small preset's) is summed, and
    the debug line that says a compute buffer "is" some size is not a report."""
    from pytest_llmperf.engines.llama_cpp_native import buffer_sizes

    log = [
        "load_tensors:          AMX model buffer size =   208.88 MiB\n",
        "load_tensors:   CPU_Mapped model buffer size = ",
        "  208.95 MiB\n",
        "llama_context:        CPU  output buffer size =     0.12 MiB\n",
        "llama_kv_cache:        CPU KV buffer size =     9.00 MiB\n",
        "sched_reserve:        CPU compute buffer size =    32.75 MiB\n",
        "~llama_context:        CPU compute buffer size is  32.7510 MiB, matches expectation of  32.7510 MiB\n",
    ]
    assert buffer_sizes(log) == pytest.approx({"model": 417.83, "output": 0.12, "kv": 9.0, "compute": 32.75})
    assert buffer_sizes(["llama_context: n_ctx = 256\n"]) == {}


def test_kv_and_compute_figures_equal_llama_cpps_reports(tiny_model_path) -> None:
    """At load and after the context is refitted to a longer workload (auto n_ctx: 256 -> 512
    tokens), the engine's figures are those llama.cpp prints for a context of that size."""
    engine = LlamaCppEngine(tiny_model_path, threads=TEST_THREADS)
    try:
        for prompt_tokens in (8, 300):
            m = measure(engine, Workload(prompt_tokens=prompt_tokens, max_tokens=4, runs=1, warmup=0))
            info = m.engine
            own = _llama_cpp_reports(str(tiny_model_path), info.n_ctx, info.n_batch, info.n_ubatch, info.flash_attn)
            assert (info.kv_mib, info.compute_mib, info.model_buffer_mib) == (
                own["KV"],
                own["compute"],
                own["model"],
            ), (prompt_tokens, info)
        other = LlamaCppEngine(tiny_model_path, threads=TEST_THREADS)  # n_ctx 256
        try:  # twice the positions, twice the cache
            assert m.engine.n_ctx == 512 and m.engine.kv_mib == 2 * other.info().kv_mib
        finally:
            other.close()
        # The mapping (smaps) is the file's tensor data: what llama.cpp's CPU_Mapped buffer holds.
        assert m.engine.model_buffer_mib - 0.005 <= m.engine.mapped_mib <= tiny_model_path.stat().st_size / 2**20
        rec = stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now").to_json()
        assert rec["memory"]["buffer_source"] == "llama.cpp log"
        assert rec["memory"]["kv_mib"] == m.engine.kv_mib and rec["memory"]["rss_mib"] > m.engine.mapped_mib
    finally:
        engine.close()


def test_the_engine_worker_reports_its_own_process_memory_and_refitted_context(tiny_model_path) -> None:
    from pytest_llmperf.engines.llama_cpp_native import EngineConfig
    from pytest_llmperf.measuring.worker import load_worker

    worker = load_worker(EngineConfig(model=str(tiny_model_path), threads=TEST_THREADS))
    try:
        at_load = worker.info()
        m = measure(worker, Workload(prompt_tokens=300, max_tokens=4, runs=1, warmup=0))
        # The info after the runs is the refitted context's, as the worker's engine reports it.
        assert (at_load.n_ctx, m.engine.n_ctx) == (256, 512)
        assert m.engine.kv_mib == 2 * at_load.kv_mib and m.engine.compute_mib > at_load.compute_mib
        # Peak RSS is the worker's: with the model mapped and resident, above the file's size.
        assert m.peak_rss is not None and m.peak_rss.scope == "measurement"
        assert m.peak_rss.bytes > tiny_model_path.stat().st_size
        status = Path(f"/proc/{worker.pid}/status").read_text()
        hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
        assert m.peak_rss.bytes <= hwm  # the worker's high-water mark, read before these lines
    finally:
        worker.close()


def test_cold_is_claimed_only_when_the_eviction_took(tiny_model_path, tmp_path) -> None:
    """A private copy of the model (no other process maps it). With the measuring engine alive
    the file stays mapped, so eviction cannot take: the loads are warm, and said so. With the
    engine released first, each load is cold exactly when mincore found the file evicted."""
    path = tmp_path / "tiny-copy.gguf"
    shutil.copyfile(tiny_model_path, path)
    read_through(str(path))
    assert resident_share(str(path)) == 1.0
    engine = LlamaCppEngine(path, threads=TEST_THREADS)
    m = measure(engine, Workload(prompt_tokens=8, max_tokens=4, runs=2, warmup=0))

    held = with_model_loads(engine, m, "cold").model_loads
    assert held is not None and len(held.samples) == 2
    assert all(s.resident_share is not None and s.resident_share > COLD_RESIDENT_MAX for s in held.samples)
    assert held.page_cache == "warm" and "eviction did not take" in held.describe()

    released = with_model_loads(engine, m, "cold", release=lambda p: engine.close()).model_loads
    assert released is not None and all(s.resident_share is not None for s in released.samples)
    cold = [s.resident_share <= COLD_RESIDENT_MAX for s in released.samples]
    assert (released.page_cache == "cold") == all(cold), released
    assert ("eviction did not take" in released.describe()) == (not all(cold))
    if all(cold):  # ext4 here: the file left the page cache
        assert released.describe().startswith("cold (at most 0% of the file resident")

    warm = with_model_loads(engine, m, "warm").model_loads
    assert warm is not None and warm.page_cache == "warm" and warm.asked == "warm"
    assert all(s.load_ms > 0 and s.fresh_ttft_ms > s.load_ms for s in warm.samples)
    evict(str(path))  # leaves nothing behind in the page cache


def test_memory_grown_since_the_baseline_is_named_and_rss_noise_is_not(tiny_engine) -> None:
    m = measure(tiny_engine, Workload(prompt_tokens=8, max_tokens=4, runs=2, warmup=0))
    base = stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now").to_json()
    assert compare_memory(Measurement.read(base), Measurement.read(copy.deepcopy(base))) == ()
    grown = copy.deepcopy(base)
    grown["memory"]["kv_mib"] = base["memory"]["kv_mib"] * 2
    grown["memory"]["rss_mib"] = base["memory"]["rss_mib"] * (1 + MEMORY_RULE["rss_mib"][0] / 2)
    lines = compare_memory(Measurement.read(base), Measurement.read(grown))
    assert len(lines) == 1 and lines[0].startswith("KV buffer ") and "(+100%; llama.cpp log)" in lines[0]
    grown["memory"]["rss_mib"] = base["memory"]["rss_mib"] * 2 + 100
    assert [line.split()[0] for line in compare_memory(Measurement.read(base), Measurement.read(grown))] == [
        "KV",
        "peak",
    ]


def test_memory_and_load_budgets_fail_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf(max_kv_mib=1e6, max_compute_mib=1e6, max_rss_mib=1e6, max_load_ms=1e6, {FAST})
        def test_generous():
            pass

        @pytest.mark.llmperf(max_kv_mib=0.001, {FAST})
        def test_tight_kv():
            pass

        @pytest.mark.llmperf(max_load_ms=0.001, {FAST})
        def test_tight_load():
            pass
        """
    )
    result = run(pytester, "--junitxml", str(pytester.path / "junit.xml"), "--llmperf-columns", "memory,budget")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.re_match_lines(
        [
            r"^KV buffer [\d.]+ MiB > budget 0\.001 MiB \(llama\.cpp log\)$",
            r"^model load median [\d.]+ ms > budget 0\.001 ms \(2 loads, warm\)$",
        ],
        consecutive=False,
    )
    out = result.stdout.str()
    assert "Traceback" not in out
    # The terminal's memory column set, within 80 columns.
    header = next(line for line in out.splitlines() if "KV MiB" in line)
    assert all(h in header for h in ("RSS MiB", "KV MiB", "compute MiB", "load ms", "budget"))
    table = out[out.index(header) :].splitlines()[:5]
    assert all(len(line) <= 80 for line in table), table
    props = {
        p.get("name"): p.get("value")
        for case in ET.parse(pytester.path / "junit.xml").iter("testcase")
        if case.get("name") == "test_generous"
        for p in case.iter("property")
    }
    assert float(props["llmperf.kv_mib"]) > 0 and float(props["llmperf.load_ms"]) > 0
    assert props["llmperf.load_page_cache"] == "warm" and props["llmperf.load_samples"] == "2"


def test_a_memory_figure_grown_since_the_baseline_fails_the_test(pytester: pytest.Pytester) -> None:
    """Baselines recorded, then the stored KV buffer halved: the candidate's (unchanged) buffer
    has grown by 100% since the baseline, a regression line of its own; the session file with
    the memory figures is valid against the published schema."""
    import json

    from pytest_llmperf.core.documents import validate

    pytester.makepyfile(
        test_suite=f"""
        import pytest

        @pytest.mark.llmperf({FAST})
        def test_decode():
            pass
        """
    )
    run(pytester, "--llmperf-update-baselines").assert_outcomes(passed=1)
    path = pytester.path / "baselines" / "test_suite.json"
    data = json.loads(path.read_text())
    (entry,) = data["tests"]["test_decode"].values()
    kv = entry["memory"]["kv_mib"]
    entry["memory"]["kv_mib"] = kv / 2
    path.write_text(json.dumps(data))
    result = run(
        pytester, "--llmperf-json", "session.json", "--llmperf-html", "report.html", "--llmperf-markdown", "summary.md"
    )
    result.assert_outcomes(failed=1)
    html = (pytester.path / "report.html").read_text()
    assert "<th>memory and start-up</th>" in html and "<td>KV buffer</td>" in html and "llama.cpp log" in html
    md = (pytester.path / "summary.md").read_text()
    assert "### Memory and start-up" in md and "| peak RSS MiB | KV buffer MiB |" in md
    result.stdout.re_match_lines(
        [rf"^.*KV buffer {kv / 2:g} -> {kv:g} MiB \(\+100%; llama\.cpp log\) since the baseline"]
    )
    doc = json.loads((pytester.path / "session.json").read_text())
    validate(doc, "session")
    (r,) = doc["results"]
    assert "memory" in r["verdict"]["short"] and r["figures"]["kv_mib"] == kv
    assert r["record"]["memory"]["buffer_source"] == "llama.cpp log"


def test_cold_loads_in_a_session_close_its_engines_and_say_what_they_got(pytester: pytest.Pytester) -> None:
    """Through the plugin: the pool's engine of the model is closed before the cold loads (it
    maps the file) and loaded again for the next test; the label is what mincore saw."""
    import json

    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf(model_load="cold", {FAST})
        def test_cold():
            pass

        @pytest.mark.llmperf({FAST})
        def test_after():
            pass
        """
    )
    result = run(pytester, "--llmperf-json", "session.json")
    result.assert_outcomes(passed=2)
    cold, after = json.loads((pytester.path / "session.json").read_text())["results"]
    loads = cold["record"]["model_loads"]
    shares = [s["resident_share"] for s in loads["samples"]]
    assert loads["asked"] == "cold" and len(shares) == 2 and all(s is not None for s in shares)
    assert (cold["figures"]["load_page_cache"] == "cold") == all(s <= COLD_RESIDENT_MAX for s in shares)
    assert after["figures"]["load_ms"] is None and after["figures"]["kv_mib"] == cold["figures"]["kv_mib"]
