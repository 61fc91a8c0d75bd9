"""One llama.cpp engine's settings: what a test may set per test or per parametrized case.

llama-bench takes a comma list for each of these and prints a row per combination; here each
is a workload key of the marker (or of ``llmperf.measure()``), and one engine is loaded per
distinct combination (``pool.EnginePool``). Every field is part of the subject fingerprint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ..core.errors import ConfigError

from ..core.settings import CACHE_TYPES, ENGINE_DEFAULTS as DEFAULTS, UNQUANTIZED


@dataclass(frozen=True)
class EngineConfig:
    """A llama.cpp engine's identity: the model and every setting that changes its speed."""

    model: str
    threads: int | None = DEFAULTS["threads"]
    n_ctx: int | None = DEFAULTS["n_ctx"]
    n_batch: int = DEFAULTS["n_batch"]
    n_ubatch: int | None = DEFAULTS["n_ubatch"]
    flash_attn: bool = DEFAULTS["flash_attn"]
    type_k: str = DEFAULTS["type_k"]
    type_v: str = DEFAULTS["type_v"]
    n_gpu_layers: int = DEFAULTS["n_gpu_layers"]
    mmap: bool = DEFAULTS["mmap"]
    mlock: bool = DEFAULTS["mlock"]
    sample: bool = DEFAULTS["sample"]
    repack: bool | None = DEFAULTS["repack"]

    def __post_init__(self) -> None:
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in CACHE_TYPES:
                raise ConfigError(f"{name} must be one of {', '.join(CACHE_TYPES)}, got {getattr(self, name)!r}")
        if self.type_v not in UNQUANTIZED and not self.flash_attn:
            raise ConfigError(
                f"type_v={self.type_v!r} (a quantized V cache) needs flash_attn=True in llama.cpp; set both"
            )
        if self.n_ubatch is not None and self.n_ubatch > self.n_batch:
            raise ConfigError(f"n_ubatch ({self.n_ubatch}) must be <= n_batch ({self.n_batch})")

    @property
    def ubatch(self) -> int:
        return self.n_ubatch or self.n_batch

    @classmethod
    def from_settings(cls, settings: Any, overrides: Mapping[str, Any] | None = None) -> "EngineConfig":
        """The session's llama.cpp settings (``settings.EngineSettings``) with a test's own
        (marker keys) over them."""
        base = cls(
            model=settings.model, threads=settings.threads, n_ctx=settings.n_ctx, n_batch=settings.n_batch,
            n_gpu_layers=settings.gpu_layers,
        )
        return base.replace(overrides) if overrides else base

    def replace(self, overrides: Mapping[str, Any]) -> "EngineConfig":
        return dataclasses.replace(self, **dict(overrides))

    def differences(self, base: "EngineConfig") -> dict[str, Any]:
        """The fields that differ from ``base`` (a table row's or a side's short label)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(base, f.name)}

    def short(self, base: "EngineConfig | None" = None) -> str:
        """``threads=1 flash_attn=True``: what sets this engine apart (all fields without base)."""
        fields = self.differences(base) if base is not None else dataclasses.asdict(self)
        return " ".join(f"{k}={v}" for k, v in fields.items()) or "defaults"


ENGINE_KEYS = tuple(f.name for f in dataclasses.fields(EngineConfig))


def ggml_type(name: str) -> int:
    """llama.cpp's enum value of a cache type name (``q8_0`` -> 8)."""
    from gguf import GGMLQuantizationType

    return int(GGMLQuantizationType[name.upper()])
