"""What the header says about the model, without loading it into llama.cpp."""

from __future__ import annotations

from pathlib import Path

from .engine_info import _human_bytes
from .settings import EngineSettings
from .synthetic import PRESETS


def describe_model(settings: EngineSettings) -> str:
    if settings.preset:
        spec = PRESETS[settings.preset]
        return (
            f"{settings.model_label} (embedded synthetic, {spec.n_layer} layers, "
            f"{spec.n_params / 1e6:.1f} M params, {spec.dtype})"
        )
    path = Path(settings.model)
    if not path.is_file():
        return f"{path} (NOT FOUND)"
    return f"{path.name} ({_human_bytes(path.stat().st_size)}, {gguf_file_type(path) or 'unknown type'})"


def gguf_file_type(path: Path) -> str | None:
    """general.file_type from the GGUF header (memory-mapped; no tensor data is read)."""
    try:
        from gguf import GGUFReader, LlamaFileType

        field = GGUFReader(path).get_field("general.file_type")
        if field is None:
            return None
        return LlamaFileType(int(field.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except Exception:  # a header we cannot read is reported by the engine, not here
        return None
