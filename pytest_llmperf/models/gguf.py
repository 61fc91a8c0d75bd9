"""GGUF models: the embedded synthetic model (a seeded llama GGUF writer, presets, cache) and the
facts read from any GGUF file.

The embedded default model: a llama-architecture GGUF with seeded random weights.

No model hub is reachable in CI, so the plugin writes its own model. Random weights produce
meaningless text, but llama.cpp runs exactly the same kernels over them as over a trained
model of the same shape, which is what a timing test needs. Same spec, same bytes: the file
name carries a digest of the spec and the write is atomic, so the cache is safe to share
between sessions and pytest-xdist workers.

What the header says about the model, without loading it into llama.cpp."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import string
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from ..core.errors import EngineError
from ..core.formats import human_bytes
from ..core.settings import EngineSettings

#: Bump when the generator's output changes for an unchanged spec (invalidates cached files).
#: 4: the chat template (``CHAT_TEMPLATE``).
GENERATOR_VERSION = 4

DTYPES = ("F32", "F16", "Q8_0")

# SentencePiece-style special ids, as llama.cpp's "llama" tokenizer expects them.
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
N_BYTE_TOKENS = 256
FIRST_NORMAL_ID = 3 + N_BYTE_TOKENS
#: The byte tokens <0x80>..<0xFF>: never generated (their output rows are zero).
NON_ASCII_BYTE_IDS = slice(3 + 0x80, FIRST_NORMAL_ID)

#: The embedded model's ``tokenizer.chat_template``: ChatML-like, in the Jinja that llama.cpp,
#: llama-cpp-python and llama-server render (the BOS first: llama-cpp-python's chat handler adds
#: none). Its markers are no special tokens of the vocabulary: they tokenize as plain text.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """Shape and storage of a synthetic llama model."""

    name: str
    n_layer: int = 4
    n_embd: int = 256
    n_ff: int = 688
    n_head: int = 4
    n_head_kv: int = 4
    n_vocab: int = 512
    n_ctx_train: int = 2048
    dtype: str = "F32"
    seed: int = 0
    #: Per-block FFN widths (None: every block ``n_ff``). A non-uniform list is written as the
    #: ``deci`` architecture, llama's graph with per-layer widths: the llama arch rejects them.
    layer_ff: tuple[int, ...] | None = None
    #: Written as ``tokenizer.chat_template`` (False: a model without one).
    chat_template: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        self._check_shape()
        if self.dtype == "Q8_0" and (self.n_embd % 32 or any(f % 32 for f in self.ffn_widths)):
            raise ValueError("Q8_0 needs n_embd and n_ff divisible by 32")

    def _check_shape(self) -> None:
        """The heads divide the width, the vocabulary holds the fixed tokens, and ``layer_ff``
        gives one width per layer."""
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
        if self.n_vocab <= FIRST_NORMAL_ID:
            raise ValueError(f"n_vocab must exceed {FIRST_NORMAL_ID} (special and byte tokens)")
        if self.layer_ff is not None and len(self.layer_ff) != self.n_layer:
            raise ValueError(f"layer_ff needs one width per layer ({self.n_layer}), got {len(self.layer_ff)}")

    @property
    def ffn_widths(self) -> tuple[int, ...]:
        return tuple(self.layer_ff) if self.layer_ff is not None else (self.n_ff,) * self.n_layer

    @property
    def arch(self) -> str:
        return "deci" if len(set(self.ffn_widths)) > 1 else "llama"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_params(self) -> int:
        e, kv = self.n_embd, self.n_head_kv * self.head_dim
        per_layer_fixed = 2 * e + e * e * 2 + 2 * e * kv  # norms, q/o, k/v
        ffn = sum(3 * e * f for f in self.ffn_widths)
        return 2 * self.n_vocab * e + e + self.n_layer * per_layer_fixed + ffn

    def digest(self) -> str:
        fields = {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if not (k == "layer_ff" and v is None) and not (k == "chat_template" and v)
        }
        payload = json.dumps({**fields, "generator": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def filename(self) -> str:
        return f"llmperf-{self.name}-{self.dtype.lower()}-{self.digest()}.gguf"


PRESETS: dict[str, ModelSpec] = {
    # Fast enough for unit and plugin tests: 3.4 M parameters, well under 1 ms per token.
    "tiny": ModelSpec(name="tiny"),
    # GPT-2-small-sized (134 M parameters, 269 MB in F16): weights do not fit in cache, so
    # decode is memory-bound as with a real model.
    "small": ModelSpec(
        name="small", n_layer=12, n_embd=768, n_ff=2048, n_head=12, n_head_kv=12, n_vocab=32000, dtype="F16"
    ),
}


def _vocab(n_vocab: int) -> tuple[list[bytes], list[float], list[int]]:
    """Special tokens, the 256 byte tokens (every text encodes) and plain pieces to fill up."""
    from gguf import TokenType

    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>".encode() for b in range(N_BYTE_TOKENS)]
    types += [TokenType.BYTE] * N_BYTE_TOKENS
    pieces = _pieces(n_vocab - len(tokens))
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    # Higher score merges first in the SentencePiece tokenizer; specials and bytes score 0.
    scores = [0.0] * FIRST_NORMAL_ID + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def _pieces(count: int) -> list[bytes]:
    """Deterministic, unique word pieces: printable characters, then letter pairs, triples."""
    space = "\u2581"  # SentencePiece's word-start marker
    letters = string.ascii_lowercase
    out: list[str] = []
    singles = [c for c in string.printable if not c.isspace()]
    out += [space] + singles + [space + c for c in singles]
    for length in (2, 3, 4):
        for combo in itertools.product(letters, repeat=length):
            word = "".join(combo)
            out += [space + word, word]
            if len(out) >= count:
                return [p.encode() for p in out[:count]]
    raise ValueError(f"cannot make {count} distinct pieces")


def write_gguf(spec: ModelSpec, path: str | os.PathLike[str]) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` (overwrites). Deterministic in ``spec``."""
    import gguf
    import numpy as np  # numpy costs nothing until a model is written

    path = Path(path)

    rng = np.random.default_rng(spec.seed)
    qtype = gguf.GGMLQuantizationType[spec.dtype]
    file_type = {
        "F32": gguf.LlamaFileType.ALL_F32,
        "F16": gguf.LlamaFileType.MOSTLY_F16,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[spec.dtype]

    writer = gguf.GGUFWriter(path, spec.arch)
    writer.add_name(f"llmperf-synthetic-{spec.name}")
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff if spec.arch == "llama" else list(spec.ffn_widths))
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_file_type(int(file_type))

    tokens, scores, types = _vocab(spec.n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    if spec.chat_template:
        writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(name: str, n_out: int, n_in: int, zero_rows: slice | None = None) -> None:
        weights = rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(0.02)
        if zero_rows is not None:
            weights[zero_rows] = 0.0
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, weights)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, weights.astype(np.float16))
        else:  # quantized: bytes per row, the shape in elements is derived from raw_dtype
            writer.add_tensor(name, gguf.quants.quantize(weights, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(spec.n_embd, dtype=np.float32))  # 1-D stays F32

    e, kv = spec.n_embd, spec.n_head_kv * spec.head_dim
    matrix("token_embd.weight", spec.n_vocab, e)
    for i, n_ff in enumerate(spec.ffn_widths):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", e, e)
        matrix(f"blk.{i}.attn_k.weight", kv, e)
        matrix(f"blk.{i}.attn_v.weight", kv, e)
        matrix(f"blk.{i}.attn_output.weight", e, e)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", n_ff, e)
        matrix(f"blk.{i}.ffn_up.weight", n_ff, e)
        matrix(f"blk.{i}.ffn_down.weight", e, n_ff)
    norm("output_norm.weight")
    # The non-ASCII byte tokens' logits are exactly 0, below the largest of the random others:
    # greedy decoding never emits one, so no output is an incomplete UTF-8 character that a
    # server holds back (a stream whose tokens all arrive in one event has no gaps to measure).
    matrix("output.weight", spec.n_vocab, e, zero_rows=NON_ASCII_BYTE_IDS)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def default_cache_dir() -> Path:
    """``$LLMPERF_CACHE_DIR``, else the user cache dir: models are shared across projects."""
    return Path(os.environ.get("LLMPERF_CACHE_DIR") or platformdirs.user_cache_dir("pytest-llmperf"))


def preset_of(model: str) -> str | None:
    """The preset ``model`` names, unless a file of that name exists (a file wins)."""
    return model if model in PRESETS and not Path(model).exists() else None


def model_path(model: str) -> tuple[Path, str | None]:
    """The GGUF a model setting names, and its display name when it is a preset
    ("synthetic-tiny"; None for a file): a preset's model is written once, then cached."""
    preset = preset_of(model)
    if preset:
        return ensure_model(preset), f"synthetic-{preset}"
    path = Path(model)
    if path.is_file():  # a missing file is the engine's line (check_gguf); an unreadable one, here
        try:
            os.close(os.open(path, os.O_RDONLY))
        except OSError as exc:
            raise EngineError(
                f"cannot read the model file {path}: {exc.strerror}; make it readable (chmod a+r {path}) "
                "or give another GGUF path or a preset name (tiny, small)"
            ) from None
    return path, None


def ensure_model(spec: ModelSpec | str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of the cached GGUF for ``spec`` (a ModelSpec or a preset name), writing it once."""
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise KeyError(f"unknown preset {spec!r}; presets: {', '.join(PRESETS)}")
        spec = PRESETS[spec]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = folder / spec.filename()
    if not target.is_file():
        _write_cached(spec, folder, target, default_folder=cache_dir is None)
    return target


def _write_cached(spec: ModelSpec, folder: Path, target: Path, *, default_folder: bool) -> None:
    """Write ``spec``'s GGUF as ``target`` in ``folder``: beside it first, then renamed, so
    readers never see a half-written model. ``default_folder``: ``folder`` is the default one
    (``$LLMPERF_CACHE_DIR`` when set), named in the error."""
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=folder)
        os.close(fd)
        write_gguf(spec, tmp)
        os.replace(tmp, target)
    except OSError as exc:
        where = " ($LLMPERF_CACHE_DIR)" if default_folder and os.environ.get("LLMPERF_CACHE_DIR") else ""
        raise EngineError(
            f"cannot write the embedded model to {folder}{where}: {exc.strerror or exc}; "
            "set LLMPERF_CACHE_DIR to a writable folder"
        ) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


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
    except Exception:  # noqa: BLE001 - gguf raises what its parsing hits; the engine reports a bad header
        return None


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types
_STRING, _ARRAY = 8, 9


def gguf_tensor_sizes(path: str | Path) -> dict[str, tuple[int, int]]:
    """{tensor name: (elements, bytes)} from a GGUF header, skipping the metadata values.

    gguf's GGUFReader builds arrays for every metadata value (seconds for a 32k vocabulary);
    this reads only what the roofline needs, in milliseconds.
    """
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
        elements = math.prod(dims)
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        sizes[name] = (elements, elements // block * type_size)
    return sizes


def embedding_lookup(path: str | Path) -> tuple[int, int] | None:
    """(params, bytes) of the token-embedding table when it is only looked up (one row read per
    token) because the output projection has its own weights; (0, 0) when they are tied;
    None when the header cannot be read."""
    try:
        sizes = gguf_tensor_sizes(path)
    except Exception:  # noqa: BLE001 - as above: the roofline falls back to the whole model
        return None
    if "token_embd.weight" not in sizes:
        return None
    return sizes["token_embd.weight"] if "output.weight" in sizes else (0, 0)
