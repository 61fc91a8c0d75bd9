"""What the header says about the model, without loading it into llama.cpp."""

from __future__ import annotations

from pathlib import Path

from ..core.formats import human_bytes
from ..core.settings import EngineSettings
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
    return f"{path.name} ({human_bytes(path.stat().st_size)}, {gguf_file_type(path) or 'unknown type'})"


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


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types
_STRING, _ARRAY = 8, 9


def gguf_tensor_sizes(path: str | Path) -> dict[str, tuple[int, int]]:
    """{tensor name: (elements, bytes)} from a GGUF header, skipping the metadata values.

    gguf's GGUFReader builds arrays for every metadata value (seconds for a 32k vocabulary);
    this reads only what the roofline needs, in milliseconds.
    """
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as fh:
        data = fh.read(64 * 2**20)  # headers are far smaller; tensor data follows them
    if data[:4] != b"GGUF":
        raise ValueError(f"not a GGUF file: {path}")
    pos = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16

    def skip_string(p: int) -> int:
        (n,) = struct.unpack_from("<Q", data, p)
        return p + 8 + n

    def skip_value(p: int, vtype: int) -> int:
        if vtype == _STRING:
            return skip_string(p)
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", data, p)
            p += 12
            if etype in _SCALAR_SIZES:
                return p + count * _SCALAR_SIZES[etype]
            for _ in range(count):
                p = skip_value(p, etype)
            return p
        return p + _SCALAR_SIZES[vtype]

    for _ in range(n_kv):
        pos = skip_string(pos)
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos = skip_value(pos + 4, vtype)
    sizes = {}
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", data, pos)
        name = data[pos + 8 : pos + 8 + n].decode("utf-8")
        pos += 8 + n
        (n_dims,) = struct.unpack_from("<I", data, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
        pos += 4 + 8 * n_dims
        ttype, _offset = struct.unpack_from("<IQ", data, pos)
        pos += 12
        elements = 1
        for d in dims:
            elements *= d
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        sizes[name] = (elements, elements // block * type_size)
    return sizes


def embedding_lookup(path: str | Path) -> tuple[int, int] | None:
    """(params, bytes) of the token-embedding table when it is only looked up (one row read per
    token) because the output projection has its own weights; (0, 0) when they are tied;
    None when the header cannot be read."""
    try:
        sizes = gguf_tensor_sizes(path)
    except Exception:  # an unreadable header: the roofline falls back to the whole model
        return None
    if "token_embd.weight" not in sizes:
        return None
    return sizes["token_embd.weight"] if "output.weight" in sizes else (0, 0)
