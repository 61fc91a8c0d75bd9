"""The embedded model: deterministic bytes, cached, loadable, every text encodable."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pytest_llmperf import LlamaCppEngine, ModelSpec, Workload, ensure_model, measure, write_gguf
from pytest_llmperf.models.gguf import PRESETS


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_spec_same_bytes(tmp_path: Path) -> None:
    spec = PRESETS["tiny"]
    a = write_gguf(spec, tmp_path / "a.gguf")
    b = write_gguf(spec, tmp_path / "b.gguf")
    assert sha256(a) == sha256(b)


def test_seed_changes_bytes_and_name(tmp_path: Path) -> None:
    spec = PRESETS["tiny"]
    other = ModelSpec(name="tiny", seed=1)
    assert spec.filename() != other.filename()
    assert sha256(write_gguf(spec, tmp_path / "a.gguf")) != sha256(write_gguf(other, tmp_path / "b.gguf"))


def test_cache_writes_once(tmp_path: Path) -> None:
    first = ensure_model("tiny", tmp_path)
    stamp = first.stat().st_mtime_ns
    again = ensure_model("tiny", tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temp file left behind


def test_presets_shapes() -> None:
    assert PRESETS["tiny"].n_layer == 4
    assert PRESETS["small"].n_params > 100e6


@pytest.mark.parametrize("dtype", ["F16", "Q8_0"])
def test_dtypes_load_and_generate(tmp_path: Path, dtype: str) -> None:
    spec = ModelSpec(name="t", n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, dtype=dtype)
    engine = LlamaCppEngine(ensure_model(spec, tmp_path))
    try:
        assert engine.info().quantization == dtype
        assert engine.info().n_layer == 2
        m = measure(engine, Workload(prompt_tokens=8, max_tokens=4, runs=1, warmup=0))
        assert m.output_tokens == 4
    finally:
        engine.close()


def test_any_text_encodes(tiny_engine) -> None:
    text = "naïve café ∑ 日本語 🚀 plain ascii"
    ids = tiny_engine.llm.tokenize(text.encode(), add_bos=False)
    assert ids
    assert tiny_engine.llm.detokenize(ids).decode().strip() == text
    assert tiny_engine.llm.tokenize(b"", add_bos=True) == [1]  # BOS only


def test_bad_spec() -> None:
    with pytest.raises(ValueError, match="dtype"):
        ModelSpec(name="x", dtype="Q4_K")
    with pytest.raises(ValueError, match="n_head"):
        ModelSpec(name="x", n_embd=100, n_head=3)


def test_greedy_output_never_holds_back_incomplete_utf8(tiny_engine) -> None:
    """The non-ASCII byte tokens' output rows are zero (their logits exactly 0, below the
    largest random one): greedy decoding never emits a lone UTF-8 lead byte that a server
    holds back, so a served stream has its token gaps (tests/test_llama_server.py)."""
    import gguf
    import numpy as np

    from pytest_llmperf.engines import synthetic_text
    from pytest_llmperf.models.gguf import NON_ASCII_BYTE_IDS

    reader = gguf.GGUFReader(str(ensure_model("tiny")))
    (output,) = [t for t in reader.tensors if t.name == "output.weight"]
    rows = np.asarray(output.data).reshape(PRESETS["tiny"].n_vocab, -1)
    assert not rows[NON_ASCII_BYTE_IDS].any() and rows[NON_ASCII_BYTE_IDS.stop :].any()
    llm = tiny_engine.llm
    generated: list[int] = []
    for seed in range(40):
        llm.create_completion(synthetic_text(16, seed=seed), max_tokens=16, temperature=0.0)
        generated += list(llm._input_ids[-15:])
    byte_ids = range(NON_ASCII_BYTE_IDS.start, NON_ASCII_BYTE_IDS.stop)
    assert not [t for t in generated if t in byte_ids]
    assert any(3 <= t < NON_ASCII_BYTE_IDS.start for t in generated)  # ASCII bytes still come
