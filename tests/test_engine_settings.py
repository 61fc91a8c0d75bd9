"""llama.cpp settings per test: marker keys, one engine per distinct setting, the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inner import run

from pytest_llmperf.core.errors import ConfigError, EngineError
from pytest_llmperf.core.fingerprint import subject, subject_changes
from pytest_llmperf.engines.llama_cpp_native import EngineConfig
from pytest_llmperf.engines.pool import EnginePool
from pytest_llmperf.engines.pool import load_config as load_engine_config
from pytest_llmperf.session.options import validate


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"type_k": "q9_0"}, "'type_k' must be one of f32, f16"),
        ({"flash_attn": "yes"}, "'flash_attn' must be True or False"),
        ({"gpu_layers": -2}, "'gpu_layers' must be an integer >= -1"),
        ({"threads": 0}, "'threads' must be >= 1"),
        ({"n_ubatch": 1.5}, "'n_ubatch' must be an integer"),
    ],
)
def test_bad_settings_fail_with_one_line(keys, message) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(keys)


def test_settings_are_their_own_kind() -> None:
    config = validate({"threads": 2, "flash_attn": True, "type_k": "Q8_0", "runs": 3})
    assert dict(config.engine) == {"threads": 2, "flash_attn": True, "type_k": "q8_0"}
    assert dict(config.workload) == {"runs": 3}
    assert dict(config.merged({"threads": 1}).engine) == {"threads": 1, "flash_attn": True, "type_k": "q8_0"}


def test_quantized_v_needs_flash_attention() -> None:
    with pytest.raises(ConfigError, match="type_v='q8_0' .* needs flash_attn=True"):
        EngineConfig(model="tiny", type_v="q8_0", flash_attn=False)
    with pytest.raises(ConfigError, match=r"n_ubatch \(1024\) must be <= n_batch \(512\)"):
        EngineConfig(model="tiny", n_ubatch=1024)


def test_pool_loads_each_setting_once_frees_after_last_use_and_bounds(tiny_model_path) -> None:
    base = EngineConfig(model=str(tiny_model_path), threads=1, n_ctx=256)
    fa, ub = base.replace({"flash_attn": False}), base.replace({"n_ubatch": 64})
    pool = EnginePool(load_engine_config, max_alive=2)
    pool.plan([fa, fa, ub])
    pool.pin(base)
    engine = pool.get(base)
    assert pool.get(fa).info().flash_attn is False
    pool.finished(fa)
    assert pool.alive() == [base, fa]  # one more test names it
    assert pool.get(fa) is pool.get(fa)
    pool.finished(fa)
    assert pool.alive() == [base]  # freed after its last test
    assert pool.get(ub).info().n_ubatch == 64
    # A setting no test names (given to measure()) beyond the bound: the least recently used
    # unpinned engine of an earlier test goes; the pinned session engine stays.
    pool.finished(None)
    other = base.replace({"n_batch": 128})
    pool.get(ub)
    pool.finished(None)  # ub is still planned once: kept
    pool.get(other)
    assert base in pool.alive() and other in pool.alive() and len(pool.alive()) == 2
    assert pool.loads[fa] == 1 and pool.loads[base] == 1
    assert engine.info().n_ctx == 256
    pool.close()
    assert pool.alive() == []


def test_a_failed_load_is_remembered(tmp_path) -> None:
    pool = EnginePool(load_engine_config)
    bad = EngineConfig(model=str(tmp_path / "missing.gguf"))
    for _ in range(2):
        with pytest.raises(EngineError, match="model file not found"):
            pool.get(bad)
    assert pool.loads[bad] == 0


def test_every_setting_is_in_the_subject_fingerprint(tiny_model_path) -> None:
    config = EngineConfig(
        model=str(tiny_model_path),
        threads=1,
        n_ctx=256,
        n_ubatch=128,
        flash_attn=True,
        type_k="q8_0",
        type_v="q8_0",
        mmap=False,
    )
    engine = load_engine_config(config)
    try:
        s = subject(engine.info())
    finally:
        engine.close()
    assert {
        k: s[k]
        for k in (
            "n_threads",
            "n_ctx",
            "n_batch",
            "n_ubatch",
            "flash_attn",
            "type_k",
            "type_v",
            "mmap",
            "mlock",
            "n_gpu_layers",
        )
    } == {
        "n_threads": 1,
        "n_ctx": 256,
        "n_batch": 256,
        "n_ubatch": 128,
        "flash_attn": True,
        "type_k": "q8_0",
        "type_v": "q8_0",
        "mmap": False,
        "mlock": False,
        "n_gpu_layers": 0,
    }
    before = dict(s, flash_attn=False)
    assert "flash attention False -> True" in subject_changes(before, s)
    old = {k: v for k, v in s.items() if k not in ("flash_attn", "n_ubatch")}  # recorded before these keys
    assert subject_changes(old, s) == []


def test_parametrized_sweep_one_row_per_case(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("threads", [1, 2])
        @pytest.mark.parametrize("flash_attn", [False, True])
        @pytest.mark.llmperf(prompt_tokens=16, max_tokens=4, runs=2, warmup=0)
        def test_sweep(llmperf, threads, flash_attn):
            m = llmperf.measure(threads=threads, flash_attn=flash_attn)
            assert (m.engine.threads, m.engine.flash_attn) == (threads, flash_attn)

        @pytest.mark.llmperf(n_ctx=512, prompt_tokens=16, max_tokens=4, runs=2, warmup=0)
        def test_marker_setting(llmperf):
            assert llmperf.engine.info().n_ctx == 512
        """
    )
    result = run(pytester, "--llmperf-columns", "prefill,decode")
    result.assert_outcomes(passed=5)
    out = result.stdout.str()
    for case in ("False-1", "False-2", "True-1", "True-2"):
        assert f"test_sweep[{case}]" in out


def test_gpu_layers_are_recorded_as_llama_cpp_offloads_them(tiny_model_path: Path) -> None:
    """Hostile (issue 21): ``gpu_layers=99`` on a CPU-only build was recorded as 99 offloaded
    layers. The record says what llama.cpp does: none without a GPU backend, else at most the
    model's layers plus the output layer."""
    import llama_cpp

    from pytest_llmperf import LlamaCppEngine

    engine = LlamaCppEngine(tiny_model_path, threads=1, gpu_layers=99)
    try:
        info = engine.info()
    finally:
        engine.close()
    assert info.gpu_layers == (info.n_layer + 1 if llama_cpp.llama_supports_gpu_offload() else 0)


def test_offload_kqv_in_a_marker_reaches_llama_cpp_the_engine_info_and_the_record(pytester: pytest.Pytester) -> None:
    """A setting added as one table entry: the marker's ``offload_kqv=False`` is what llama.cpp's
    context holds (in process), what the engine reports (in process and in the worker) and what
    the session's record stores in its subject fingerprint."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(offload_kqv=False, prompt_tokens=16, max_tokens=4, runs=2, warmup=0)
        def test_kqv(llmperf, request):
            engine = llmperf.engine
            if request.config.getoption("llmperf_in_process"):
                assert engine.llm.context_params.offload_kqv is False
                assert engine.llm.__getstate__()["offload_kqv"] is False
            assert engine.info().offload_kqv is False
            assert llmperf.measure().engine.offload_kqv is False
        """
    )
    for mode in ("--llmperf-in-process", "--llmperf-engine-timeout=600"):
        run(pytester, mode, "--llmperf-json", "session.json").assert_outcomes(passed=1)
        (result,) = json.loads((pytester.path / "session.json").read_text())["results"]
        assert result["record"]["subject"]["offload_kqv"] is False, mode
    assert "KV offload True -> False" in subject_changes(
        {**result["record"]["subject"], "offload_kqv": True}, result["record"]["subject"]
    )
