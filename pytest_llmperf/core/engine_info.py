"""Describes the engine and model a measurement ran on (report header, baselines)."""

from __future__ import annotations

from dataclasses import dataclass

from .numbers import human_bytes


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about an engine: which backend, which model, which settings."""

    engine: str
    model: str
    model_path: str | None = None
    model_size_bytes: int | None = None
    n_params: int | None = None
    quantization: str | None = None
    n_layer: int | None = None
    n_embd: int | None = None
    n_head: int | None = None
    n_head_kv: int | None = None
    kv_bytes_per_element: float | None = None  # K and V cache type (F16: 2)
    # The token-embedding table when it is only looked up (output has its own weights): a token
    # reads one row of it and does no FLOPs with it. (0, 0) when tied; None when unknown.
    embedding_lookup_params: int | None = None
    embedding_lookup_bytes: int | None = None
    n_threads: int | None = None
    n_ctx: int | None = None
    n_batch: int | None = None
    n_gpu_layers: int | None = None
    # llama.cpp context settings beyond threads/n_ctx/n_batch (engines/config.py); None: not llama.cpp
    n_ubatch: int | None = None
    flash_attn: bool | None = None
    type_k: str | None = None
    type_v: str | None = None
    mmap: bool | None = None
    mlock: bool | None = None
    sample: bool | None = None  # greedy sampling inside the timed decode loop
    repack: bool | None = None  # llama.cpp use_extra_bufts (weight repacking, AMX kernels)
    repack_note: str | None = None  # why repack is not llama.cpp's default (the AMX workaround)
    load_ms: float | None = None
    native_load_ms: float | None = None
    backend_version: str | None = None
    endpoint: str | None = None  # served models: the API base URL (never the API key)
    token_count: str | None = None  # served models: token counts from "usage" or "events"

    def describe(self) -> str:
        parts = [self.model]
        if self.model_size_bytes is not None:
            parts.append(human_bytes(self.model_size_bytes))
        if self.quantization:
            parts.append(self.quantization)
        if self.n_params is not None:
            parts.append(f"{self.n_params / 1e6:.1f} M params")
        if self.n_layer is not None:
            parts.append(f"{self.n_layer} layers")
        if self.endpoint:
            parts.append(f"at {self.endpoint}")
        if self.token_count:
            parts.append(f"tokens counted from {self.token_count}")
        return ", ".join(parts)
