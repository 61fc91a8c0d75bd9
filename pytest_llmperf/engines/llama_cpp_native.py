"""llama-cpp-python's native side, below the engine: importing it, checking a model file,
building the sampler, and reading the model's facts (quantization, cache element size).

Apart from the engine class because these are facts about the library and the file, not about
one loaded model's runs: the profile command checks a model path with ``check_gguf`` before
any engine exists, and the engine's module stays the engine.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import EngineError

GGUF_MAGIC = b"GGUF"


def import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EngineError(
            f"llama-cpp-python is not importable ({exc}); install it: pip install llama-cpp-python"
        ) from None
    return llama_cpp


def llama_cpp_version() -> str | None:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return None


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """Fail with a one-line message unless ``path`` is a readable GGUF file."""
    p = Path(path)
    if not p.exists():
        raise EngineError(f"model file not found: {p}; give a GGUF path or a preset name (tiny, small)")
    if not p.is_file():
        raise EngineError(f"model path is not a file: {p}")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise EngineError(f"not a GGUF model file (starts with {magic!r}, expected b'GGUF'): {p}")
    return p


def default_threads() -> int:
    """All CPUs this process may use (llama-cpp-python's own default is half of them)."""
    from ..core.settings import usable_cpus

    return usable_cpus()



def greedy_sampler(lib: Any, n_vocab: int, banned: Sequence[int]) -> Any:
    """Greedy sampling with every ``banned`` (end-of-generation) token banned: runs have equal
    length. The caller owns it (``lib.llama_sampler_free``)."""
    params = lib.llama_sampler_chain_default_params()
    params.no_perf = False  # keep llama.cpp's sampler counters (sampling ms/token)
    chain = lib.llama_sampler_chain_init(params)
    if banned:
        biases = (lib.llama_logit_bias * len(banned))()
        for slot, token in zip(biases, banned):
            slot.token = token
            slot.bias = float("-inf")
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_logit_bias(n_vocab, len(banned), biases))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
    return chain


def kv_bytes_per_element(params: Any) -> float | None:
    """Mean bytes per K/V cache element, from the context's cache types (F16 by default)."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        sizes = [GGML_QUANT_SIZES[GGMLQuantizationType(int(t))] for t in (params.type_k, params.type_v)]
    except (ImportError, ValueError, KeyError):
        return None
    return sum(type_size / block for block, type_size in sizes) / 2


def quantization(meta: dict[str, str]) -> str | None:
    """general.file_type as llama.cpp names it (F16, Q8_0, Q4_K_M...)."""
    raw = meta.get("general.file_type")
    if raw is None:
        return None
    try:
        from gguf import LlamaFileType

        name = LlamaFileType(int(raw)).name
    except (ImportError, ValueError):
        return f"file_type {raw}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")
