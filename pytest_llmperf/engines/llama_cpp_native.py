"""llama-cpp-python's native side, below the engine: importing it, checking a model file,
building the sampler, reading the model's facts (quantization, cache element size), the CPU
facts that choose weight repacking (AMX), and what a crash of llama.cpp means (the engine
worker's one line: the signal, llama.cpp's last words, a known cause).

Apart from the engine class because these are facts about the library and the file, not about
one loaded model's runs: the profile command checks a model path with ``check_gguf`` before
any engine exists, and the engine's module stays the engine.

One llama.cpp engine's settings: what a test may set per test or per parametrized case.

llama-bench takes a comma list for each of these and prints a row per combination; here each
is a workload key of the marker (or of ``llmperf.measure()``), and one engine is loaded per
distinct combination (``pool.EnginePool``). Each setting is one entry of ``core.workload.LLAMA_SETTINGS``
(its marker key, default, ``llama_cpp.Llama`` keywords, fingerprint key, options); ``EngineConfig``
keeps a typed field per entry (tests/test_engine_keys.py names a missing one)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import signal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias

from ..core.documents import file_kind
from ..core.errors import ConfigError, EngineError, unknown_name
from ..core.formats import escaped, human_bytes
from ..core.settings import CACHE_TYPES, RENAMED, UNQUANTIZED, renamed_line, usable_cpus
from ..core.settings import ENGINE_DEFAULTS as DEFAULTS
from ..core.workload import LLAMA_SETTINGS, EngineInfo

if TYPE_CHECKING:
    from llama_cpp import Llama
    from llama_cpp.llama_cpp import llama_context_p, llama_context_params, llama_sampler_p

    #: A llama.cpp context and sampler chain as llama-cpp-python's ctypes give them (None: NULL, freed).
    Context: TypeAlias = llama_context_p | None
    Sampler: TypeAlias = llama_sampler_p | None

    from ..core.settings import EngineSettings

GGUF_MAGIC = b"GGUF"


def import_llama_cpp() -> ModuleType:
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EngineError(
            f"llama-cpp-python is not importable ({exc}); install it: pip install llama-cpp-python"
        ) from None
    return llama_cpp


def gpu_offload_missing() -> bool:
    """This llama.cpp build has no GPU backend (a CPU-only llama-cpp-python): ``gpu_layers``
    offloads nothing. False when llama-cpp-python cannot be imported (that is said elsewhere)."""
    try:
        return not import_llama_cpp().llama_supports_gpu_offload()
    except (EngineError, AttributeError):
        return False


#: llama.cpp's words for a buffer it could not allocate, with its size in bytes.
FAILED_ALLOC = re.compile(r"failed to allocate (?:\w+ )?buffer of size (\d+)")


def context_failure(path: Path, exc: BaseException, log: Sequence[str], n_ctx: int | None) -> str | None:
    """The one line for a context llama.cpp could not create after loading the model (an
    ``n_ctx`` whose KV cache does not fit in memory): the size it asked for, from its log, and
    the memory available. None for any other load failure."""
    if "llama_context" not in str(exc):
        return None
    text = "".join(log)
    sizes = [int(n) for n in FAILED_ALLOC.findall(text)]
    what = "its KV cache" if "kv cache" in text.lower() else "its context"
    need = f" of {human_bytes(max(sizes))}" if sizes else ""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            avail = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("MemAvailable:"))
        room = f", and {human_bytes(avail)} of memory is available"
    except (OSError, StopIteration, ValueError, IndexError):
        room = ""
    return (
        f"llama.cpp loaded {path.name} but could not allocate {what}{need} for n_ctx {n_ctx or 'auto'}{room}; "
        "lower n_ctx (or quantize the cache: type_k/type_v q8_0 with flash_attn=True)"
    )


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
        kind = file_kind(p.stat().st_mode)
        raise EngineError(
            f"model path {p} is {kind}, not a file; give a GGUF file's path or a preset name (tiny, small)"
        )
    try:
        with p.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise EngineError(f"cannot read the model file {p}: {exc.strerror or exc}; fix its permissions") from None
    if magic != GGUF_MAGIC:
        raise EngineError(f"not a GGUF model file (starts with {magic!r}, expected b'GGUF'): {p}")
    return p


#: Where the AMX crash is tracked upstream (docs/engine-settings.md, "repack").
AMX_ISSUE = "llama.cpp PR #26954"
#: How llama.cpp 0.3.x's AMX kernel dies: SIGILL in a worker thread without tile state (a Xeon
#: of an earlier session), SIGSEGV while loading (this project's Xeon of 2026-12-02; llama-bench
#: --repack 1 of the same build too, exit 139; --repack 0 runs).
AMX_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV})
#: Weight types llama.cpp's CPU backend never repacks (so never hands to the AMX kernels).
UNPACKED_TYPES = frozenset({"F32", "F16", "BF16"})


def cpu_has_amx() -> bool:
    """The CPU advertises Intel AMX (``amx_int8`` in /proc/cpuinfo's flags): llama.cpp built
    for it runs quantized weights through its AMX kernels when repacking is on."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "")
    except OSError:
        return False
    return "amx_int8" in flags.split()


def resolve_repack(repack: bool | None, quantization: str | None) -> tuple[bool, str | None]:
    """llama.cpp's ``use_extra_bufts`` (llama-bench ``--repack``) for a model, and why when
    it is not llama.cpp's default (on).

    ``None`` (auto): on, except for a quantized model on a CPU with AMX, where llama.cpp
    0.3.x's AMX kernel dies (``AMX_SIGNALS``; AMX_ISSUE): off there, so the
    model is measured on the plain CPU kernels, and the record says so.
    """
    if repack is not None:
        return repack, None
    if quantization is not None and quantization.upper() not in UNPACKED_TYPES and cpu_has_amx():
        return False, (
            f"repack off: a {quantization} model on this AMX CPU (llama.cpp's AMX kernel dies with SIGILL or SIGSEGV, "
            f"{AMX_ISSUE}); repack=True measures it with AMX"
        )
    return True, None


def default_threads() -> int:
    """All CPUs this process may use (llama-cpp-python's own default is half of them)."""
    return usable_cpus()


def greedy_sampler(lib: ModuleType, n_vocab: int, banned: Sequence[int]) -> llama_sampler_p:
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


def kv_bytes_per_element(params: llama_context_params) -> float | None:
    """Mean bytes per K/V cache element, from the context's cache types (F16 by default)."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        sizes = [GGML_QUANT_SIZES[GGMLQuantizationType(int(t))] for t in (params.type_k, params.type_v)]
    except (ImportError, ValueError, KeyError):
        return None
    return sum(type_size / block for block, type_size in sizes) / 2


def with_model_facts(lib: ModuleType, llm: Llama, info: EngineInfo) -> EngineInfo:
    """``info`` with a loaded ``llm``'s model facts as llama.cpp reads them (the one reader of
    them): its size and parameters, its quantization, its shape and its KV cache's bytes per
    element (of the context's cache types)."""
    model = llm._model.model
    return dataclasses.replace(
        info,
        model_size_bytes=int(lib.llama_model_size(model)),
        n_params=int(lib.llama_model_n_params(model)),
        quantization=quantization(dict(getattr(llm, "metadata", {}) or {})),
        n_layer=int(lib.llama_model_n_layer(model)),
        n_embd=int(lib.llama_model_n_embd(model)),
        n_head=int(lib.llama_model_n_head(model)),
        n_head_kv=int(lib.llama_model_n_head_kv(model)),
        kv_bytes_per_element=kv_bytes_per_element(llm.context_params),
    )


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


# -- what a crash of llama.cpp means (the engine worker's crash line) ------------------------------

#: llama.cpp log lines quoted in a crash message.
LOG_LINES = 3


def signal_name(returncode: int | None) -> str:
    """``SIGILL (illegal instruction)`` for a child killed by a signal, else ``exit status N``
    (None: a child still not reaped after SIGKILL)."""
    if returncode is None:
        return "an unknown status"
    if returncode < 0:
        sig = signal.Signals(-returncode)
        return f"{sig.name} ({signal.strsignal(sig) or 'signal'})".replace(
            "(Illegal instruction)", "(illegal instruction)"
        )
    if returncode in (132, 134, 135, 136, 137, 139):  # a shell's 128 + signal
        return signal_name(128 - returncode)
    return f"exit status {returncode}"


def known_cause(
    returncode: int | None, log: Sequence[str], config: EngineConfig, quantization: str | None
) -> str | None:
    """What a crash is known to mean, and what to do; None when it is not known."""
    sig = -returncode if returncode is not None and returncode < 0 else None
    text = "\n".join(log)
    # llama.cpp's AMX kernel's crash: a signal it dies with, on a CPU with AMX, repacked quantized weights.
    repacked = config.repack is not False and (quantization or "").upper() not in UNPACKED_TYPES
    if sig in AMX_SIGNALS and cpu_has_amx() and repacked:
        return (
            f"known cause: llama.cpp's AMX kernel for quantized weights on this Intel CPU with AMX ({AMX_ISSUE}); "
            "set repack=False (marker key, or leave repack unset: auto turns it off here) to run it without AMX"
        )
    if "LLAMA_MAX_LAYERS" in text:
        return "known cause: the GGUF declares more layers than llama.cpp supports (512): the file is corrupt or not a model"
    if sig == signal.SIGKILL:
        return "killed by SIGKILL: out of memory? (the kernel's OOM killer sends it; see dmesg) or killed by another process"
    if "GGML_ASSERT" in text or sig == signal.SIGABRT:
        return "llama.cpp aborted on a failed check: the model file or a setting is not one this llama.cpp supports"
    return None


#: What a debugger's backtrace adds after an abort (ggml runs gdb on itself): not llama.cpp's words.
_NOISE = re.compile(
    r"^(\d+\s|#\d+\s|\[New |\[Thread |\[Inferior |warning: |0x[0-9a-f]+ in |Using host libthread|"
    r"Download failed|\(gdb\)|No symbol|Missing separate debuginfo|Reading symbols|Model metadata: )"
)
#: A line that says what went wrong, quoted first when the log's tail is something else.
_ERROR = re.compile(r"GGML_ASSERT|error|failed|abort", re.IGNORECASE)


def quoted_log(text: str) -> list[str]:
    """The log lines a crash message quotes: the last line that names an error (a failed
    assert), then the last ``LOG_LINES`` lines, without debugger output, each cut at 300 chars."""
    lines = [
        escaped(line.strip()[:300]) for line in text.splitlines() if line.strip() and not _NOISE.match(line.strip())
    ]
    tail = lines[-LOG_LINES:]
    errors = [line for line in lines if _ERROR.search(line)]
    if errors and errors[-1] not in tail:
        tail = [errors[-1], *tail[1:]]
    return tail


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
    gpu_layers: int = DEFAULTS["gpu_layers"]
    mmap: bool = DEFAULTS["mmap"]
    mlock: bool = DEFAULTS["mlock"]
    offload_kqv: bool = DEFAULTS["offload_kqv"]
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
    def from_settings(cls, settings: EngineSettings, overrides: Mapping[str, object] | None = None) -> EngineConfig:
        """The session's llama.cpp settings (``settings.EngineSettings``) with a test's own
        (marker keys) over them."""
        session = {s.name: getattr(settings, s.name) for s in LLAMA_SETTINGS.values() if s.option is not None}
        base = cls(model=settings.model, **session)
        return base.replace(overrides) if overrides else base

    @classmethod
    def named(cls, model: str, settings: Mapping[str, object]) -> EngineConfig:
        """``model``'s config with llama.cpp ``settings`` by name; an unknown or old name is one ConfigError."""
        if "model" in settings:
            raise ConfigError(f"the model is given once, as the model path ({model}), not as the setting 'model'")
        return cls(model=model).replace(settings)

    def replace(self, overrides: Mapping[str, Any]) -> EngineConfig:
        """This config with ``overrides`` (``model`` and settings by name); an unknown or old name
        is one ConfigError."""
        for name in overrides:
            if name in RENAMED:
                raise ConfigError("llmperf: " + renamed_line("llama.cpp setting", name, RENAMED[name]))
            if name != "model" and name not in LLAMA_SETTINGS:
                raise ConfigError(unknown_name("llama.cpp setting", name, LLAMA_SETTINGS, "docs/engine-settings.md"))
        return dataclasses.replace(self, **dict(overrides))

    def settings(self) -> dict[str, Any]:
        """Every llama.cpp setting by name (``LLAMA_SETTINGS``'s order), without the model."""
        return {name: getattr(self, name) for name in LLAMA_SETTINGS}

    def differences(self, base: EngineConfig) -> dict[str, object]:
        """The fields that differ from ``base``."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        }


# -- memory: llama.cpp's own buffer-size reports, the model file's mapping -----------------------

#: llama.cpp's log lines that report an allocated buffer (``llama_kv_cache: CPU KV buffer size =
#: 8.00 MiB``, ``llama_context: CPU compute buffer size = ...``, ``load_tensors: CPU_Mapped model
#: buffer size = ...``); there is no C API for them (``llama_get_memory_breakdown`` is C++ only).
BUFFER_LINE = re.compile(r"^\w+:\s+(\S+)\s+(KV|compute|output|model) buffer size =\s*([\d.]+) MiB", re.MULTILINE)


@contextlib.contextmanager
def llama_log_capture(llama_cpp: ModuleType) -> Iterator[list[str]]:
    """llama.cpp's log text while the block runs, passed on to llama-cpp-python's own handler
    as before (so a verbose engine worker still logs it); that handler is back afterwards.
    Nested captures (a Llama made by the plugin's engine through the hook on ``Llama.__init__``)
    each get the whole text: one callback is installed, by the outermost."""
    from llama_cpp import _logger

    texts: list[str] = []
    if _CAPTURING:
        _CAPTURING.append(texts)
        try:
            yield texts
        finally:
            _CAPTURING.remove(texts)
        return
    previous = _logger.llama_log_callback

    @llama_cpp.llama_log_callback
    def capture(level: int, text: bytes, user_data: object) -> None:
        line = text.decode("utf-8", "replace") if text else ""
        for into in _CAPTURING:
            into.append(line)
        previous(level, text, user_data)

    _CAPTURING.append(texts)
    llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        yield texts
    finally:
        llama_cpp.llama_log_set(previous, ctypes.c_void_p(0))
        _CAPTURING.clear()


#: The lists ``llama_log_capture`` fills now (outermost first).
_CAPTURING: list[list[str]] = []


def buffer_sizes(log: Sequence[str]) -> dict[str, float]:
    """MiB per buffer kind (``kv``, ``compute``, ``output``, ``model``), summed over backends
    (CPU_Mapped and CPU_REPACK model buffers, two KV caches of a sliding-window model)."""
    out: dict[str, float] = {}
    for _, kind, mib in BUFFER_LINE.findall("".join(log)):
        out[kind.lower()] = out.get(kind.lower(), 0.0) + float(mib)
    return out


def mapped_file_mib(path: str | os.PathLike[str]) -> tuple[float, float] | None:
    """(Size, Rss) in MiB of this process's mappings of ``path`` (/proc/self/smaps); None when
    the file is not mapped (``mmap=False``) or the kernel does not say."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/smaps") as fh:
            kib = _mapped_kib(fh, target)
    except (OSError, ValueError, IndexError):
        return None
    return (kib[0] / 1024, kib[1] / 1024) if kib is not None else None


def _mapped_kib(smaps: Iterable[str], target: str) -> tuple[int, int] | None:
    """(Size, Rss) in KiB summed over the mappings of ``target`` in an smaps listing; None when
    none maps it. A mapping's header line (range perms offset dev inode path) starts a block of
    ``Key: value kB`` lines."""
    size = rss = 0
    inside = found = False
    for line in smaps:
        head = line.split(None, 5)
        if head and not head[0].endswith(":"):  # a mapping's header line: range perms offset dev inode path
            inside = len(head) == 6 and head[5].strip() == target
            found = found or inside
        elif inside and head[0] in ("Size:", "Rss:"):
            kib = int(head[1])
            size, rss = (size + kib, rss) if head[0] == "Size:" else (size, rss + kib)
    return (size, rss) if found else None
