"""llama.cpp in process, through llama-cpp-python's low-level API.

Why not ``create_completion(stream=True)``: its chunks are held back for UTF-8 and stop
sequences, so chunk times are not token times. This engine drives ``llama_decode`` and the
native sampler itself and reads the clock right after each token id is available. Everything
the run needs (token arrays, batches' inputs, output slots) is prepared before the first clock
read, so the timed region holds only llama.cpp's work and the loop that calls it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ..core.engine_info import EngineInfo
from .config import DEFAULTS, EngineConfig, ggml_type
from ..core.errors import ConfigError, EngineError
from ..models.facts import embedding_lookup
from ..core.trace import NativeCounters, RunTrace
from ..core.workload import Workload

GGUF_MAGIC = b"GGUF"
#: n_ctx None (auto): the context is sized to each workload, prompt + generated tokens rounded
#: up to this step, as llama-bench sizes its context (llama.cpp pads the cache to 256 anyway).
AUTO_CTX_STEP = 256
#: Sampler calls per run that time sampling apart when the decode loop does not sample.
SAMPLING_PROBES = 8


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


def split_prompt(n_tokens: int, n_batch: int) -> list[tuple[int, int]]:
    """(start, length) chunks of at most ``n_batch`` tokens, never a trailing 1-token chunk.

    llama.cpp books a synchronize after a single queued token as decode, not prefill; a
    one-token tail would move prompt time into the decode counters.
    """
    chunks = [(s, min(n_batch, n_tokens - s)) for s in range(0, n_tokens, n_batch)]
    if len(chunks) > 1 and chunks[-1][1] == 1:
        (s1, n1), (s2, _) = chunks[-2], chunks[-1]
        chunks[-2:] = [(s1, n1 - 1), (s2 - 1, 2)]
    return chunks


class LlamaCppEngine:
    """One loaded model and context; each ``run`` is an independent request.

    ``llm`` is the ``llama_cpp.Llama`` object, available to tests; the engine clears the KV
    cache and resets it before every run, so no prompt prefix is reused between runs.
    """

    #: Capability: per-layer timing (``layers.py``) through :meth:`instrumented_context`,
    #: :meth:`prompt_ids` and :meth:`decode_feed`; other engines do not declare it.
    supports_layer_timing = True

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_ctx: int | None = DEFAULTS["n_ctx"],
        n_threads: int | None = None,
        n_batch: int = DEFAULTS["n_batch"],
        n_gpu_layers: int = DEFAULTS["n_gpu_layers"],
        name: str | None = None,
        verbose: bool = False,
        n_ubatch: int | None = DEFAULTS["n_ubatch"],
        flash_attn: bool = DEFAULTS["flash_attn"],
        type_k: str = DEFAULTS["type_k"],
        type_v: str = DEFAULTS["type_v"],
        use_mmap: bool = DEFAULTS["mmap"],
        use_mlock: bool = DEFAULTS["mlock"],
        sample: bool = DEFAULTS["sample"],
    ) -> None:
        path = check_gguf(model_path)
        llama_cpp = import_llama_cpp()
        self._lib = llama_cpp
        threads = n_threads or default_threads()
        # Validates the combination (cache types, quantized V without flash attention...).
        self.config = EngineConfig(
            model=str(path), threads=threads, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
            flash_attn=flash_attn, type_k=type_k, type_v=type_v, n_gpu_layers=n_gpu_layers,
            mmap=use_mmap, mlock=use_mlock, sample=sample,
        )
        self.sample = sample
        started = time.perf_counter_ns()
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx or AUTO_CTX_STEP,
                n_threads=threads,
                n_threads_batch=threads,
                n_batch=n_batch,
                n_ubatch=self.config.ubatch,
                n_gpu_layers=n_gpu_layers,
                flash_attn=flash_attn,
                type_k=ggml_type(type_k),
                type_v=ggml_type(type_v),
                use_mmap=use_mmap,
                use_mlock=use_mlock,
                no_perf=False,
                verbose=verbose,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"llama.cpp could not load {path}: {exc}") from None
        load_ms = (time.perf_counter_ns() - started) / 1e6

        self._ctx = self.llm._ctx.ctx
        self.context_params = self.llm.context_params  # of the context in use
        self._auto_ctx = n_ctx is None
        self._own_ctx = False  # True once a context was made here for a workload (auto n_ctx)
        self._model = self.llm._model.model
        self._vocab = self.llm._model.vocab
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._eog_ids = [t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)]
        self._prompt_ids = np.array(
            [
                t
                for t in range(self.n_vocab)
                if not llama_cpp.llama_vocab_is_control(self._vocab, t) and t not in self._eog_ids
            ],
            dtype=np.int64,
        )
        self._sampler = self.make_sampler()
        # One throw-away evaluation: the first decode after load is several times slower, and
        # it makes llama.cpp record its own load time.
        self._evaluate_once()
        native_load_ms = llama_cpp.llama_perf_context(self._ctx).t_load_ms

        lookup = embedding_lookup(path) or (None, None)
        self._info = EngineInfo(
            engine="llama.cpp",
            model=name or path.stem,
            model_path=str(path),
            model_size_bytes=int(llama_cpp.llama_model_size(self._model)),
            n_params=int(llama_cpp.llama_model_n_params(self._model)),
            quantization=_quantization(self.llm.metadata),
            n_layer=int(llama_cpp.llama_model_n_layer(self._model)),
            n_embd=int(llama_cpp.llama_model_n_embd(self._model)),
            n_head=int(llama_cpp.llama_model_n_head(self._model)),
            n_head_kv=int(llama_cpp.llama_model_n_head_kv(self._model)),
            kv_bytes_per_element=_kv_bytes_per_element(self.llm.context_params),
            embedding_lookup_params=lookup[0],
            embedding_lookup_bytes=lookup[1],
            n_threads=threads,
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_gpu_layers=n_gpu_layers,
            n_ubatch=self.config.ubatch,
            flash_attn=flash_attn,
            type_k=type_k,
            type_v=type_v,
            mmap=use_mmap,
            mlock=use_mlock,
            sample=sample,
            load_ms=load_ms,
            native_load_ms=float(native_load_ms),
            backend_version=llama_cpp_version(),
        )

    # -- setup -------------------------------------------------------------------------------

    @property
    def lib(self) -> Any:
        """llama-cpp-python's low-level bindings (``llama_cpp``), for callers driving a context."""
        return self._lib

    def make_sampler(self) -> Any:
        """Greedy sampling with every end-of-generation token banned: runs have equal length.
        The caller owns it (``lib.llama_sampler_free``)."""
        lib = self._lib
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = False  # keep llama.cpp's sampler counters (sampling ms/token)
        chain = lib.llama_sampler_chain_init(params)
        if self._eog_ids:
            biases = (lib.llama_logit_bias * len(self._eog_ids))()
            for slot, token in zip(biases, self._eog_ids):
                slot.token = token
                slot.bias = float("-inf")
            lib.llama_sampler_chain_add(
                chain, lib.llama_sampler_init_logit_bias(self.n_vocab, len(self._eog_ids), biases)
            )
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        return chain

    def _clear(self) -> None:
        lib = self._lib
        lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
        self.llm.reset()  # keep the Llama object's own token bookkeeping in step
        lib.llama_sampler_reset(self._sampler)
        lib.llama_perf_context_reset(self._ctx)
        lib.llama_perf_sampler_reset(self._sampler)

    def _evaluate_once(self) -> None:
        ids = (self._lib.llama_token * 2)(*self.synthetic_prompt(2, seed=0))
        if self._lib.llama_decode(self._ctx, self._lib.llama_batch_get_one(ids, 2)) != 0:
            raise EngineError("llama.cpp failed its first evaluation of the model")
        self._lib.llama_synchronize(self._ctx)
        self._clear()

    def synthetic_prompt(self, n_tokens: int, seed: int) -> list[int]:
        """Exactly ``n_tokens`` ids: BOS (if the model wants one) then seeded ordinary tokens."""
        rng = np.random.default_rng(seed)
        head: list[int] = []
        if self._lib.llama_vocab_get_add_bos(self._vocab):
            head = [int(self._lib.llama_vocab_bos(self._vocab))]
        body = rng.choice(self._prompt_ids, size=max(n_tokens - len(head), 0))
        return (head + [int(t) for t in body])[:n_tokens]

    # -- Engine protocol -----------------------------------------------------------------------

    def info(self) -> EngineInfo:
        return self._info

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        if workload.shared_prefix_tokens:  # this engine clears its KV cache before every run
            raise ConfigError("shared_prefix_tokens measures a server's prompt cache: use a served model (an endpoint)")
        lib = self._lib
        clock = time.perf_counter_ns
        max_tokens = workload.max_tokens
        tokenize_ns = 0
        if workload.prompt is not None:
            text = workload.prompt.encode("utf-8")
            before = clock()
            prompt_ids = self.llm.tokenize(text, add_bos=True, special=False)
            tokenize_ns = clock() - before
        else:
            n_prompt = workload.synthetic_prompt_tokens or 0
            self.check_fits(n_prompt, max_tokens)  # before building the prompt: it may be huge
            prompt_ids = self.synthetic_prompt(n_prompt, workload.seed)
        self.fit_context(len(prompt_ids) + max_tokens)
        self.check_fits(len(prompt_ids), max_tokens)
        # The arrays must outlive the batches that point into them (kept in ``arrays``).
        arrays = [
            (lib.llama_token * n)(*prompt_ids[s : s + n])
            for s, n in split_prompt(len(prompt_ids), self.n_batch)
        ]
        prompt_batches = [lib.llama_batch_get_one(a, len(a)) for a in arrays]
        one = (lib.llama_token * 1)()
        batch_one = lib.llama_batch_get_one(one, 1)
        self._clear()

        decode = lib.llama_decode
        sample = lib.llama_sampler_sample
        sync = lib.llama_synchronize
        ctx, sampler = self._ctx, self._sampler
        token_ns = [0] * max_tokens
        token_ids = [0] * max_tokens
        if not self.sample:
            # As llama-bench's tg: each step feeds a seeded token, no sampler runs between the
            # clock reads (sampling is timed apart, after the run: ``_time_sampling``).
            token_ids = self.decode_feed(workload)
            feed = (lib.llama_token * max_tokens)(*token_ids)

        start = clock()
        for batch in prompt_batches:
            if decode(ctx, batch) != 0:
                raise EngineError(f"llama_decode failed on the prompt ({len(prompt_ids)} tokens)")
        sync(ctx)
        prefill_done = clock()
        if self.sample:
            token = sample(sampler, ctx, -1)
            token_ns[0] = clock()
            token_ids[0] = token
            for i in range(1, max_tokens):
                one[0] = token
                if decode(ctx, batch_one) != 0:
                    raise EngineError(f"llama_decode failed at generated token {i + 1}")
                token = sample(sampler, ctx, -1)
                token_ns[i] = clock()
                token_ids[i] = token
        else:
            token_ns[0] = prefill_done  # the first token's logits are ready
            for i in range(1, max_tokens):
                one[0] = feed[i - 1]
                if decode(ctx, batch_one) != 0:
                    raise EngineError(f"llama_decode failed at generated token {i + 1}")
                sync(ctx)
                token_ns[i] = clock()

        perf = lib.llama_perf_context(ctx)
        if not self.sample:
            self._time_sampling(max_tokens)
        sampled = lib.llama_perf_sampler(sampler)
        return RunTrace(
            start_ns=start,
            prefill_done_ns=prefill_done,
            token_ns=tuple(token_ns),
            prompt_tokens=len(prompt_ids),
            tokenize_ns=tokenize_ns,
            native=NativeCounters(
                prefill_ms=float(perf.t_p_eval_ms),
                prefill_tokens=int(perf.n_p_eval),
                decode_ms=float(perf.t_eval_ms),
                decode_tokens=int(perf.n_eval),
                sample_ms=float(sampled.t_sample_ms),
                sample_count=int(sampled.n_sample),
            ),
            token_ids=tuple(token_ids),
        )

    def _time_sampling(self, max_tokens: int) -> None:
        """Run the sampler (greedy over the vocabulary, end-of-generation banned) on the last
        logits, outside the timed region, so llama.cpp's sampler counters give the sampling
        cost per token that a generating server adds on top of decode."""
        lib = self._lib
        for _ in range(min(max_tokens, SAMPLING_PROBES)):
            lib.llama_sampler_sample(self._sampler, self._ctx, -1)

    def instrumented_context(self, cb_eval: Any, tokens: int) -> Any:
        """A second context on this engine's model with the plain one's parameters (threads,
        batch, cache types, attention kernel), ``cb_eval`` installed, and room for ``tokens``:
        only the callback differs from what ``run`` measures. The caller frees it
        (``lib.llama_free``)."""
        self.fit_context(tokens)
        params = type(self.context_params).from_buffer_copy(self.context_params)
        params.cb_eval = cb_eval
        params.cb_eval_user_data = None
        ctx = self._lib.llama_init_from_model(self._model, params)
        if not ctx:
            raise EngineError("llama.cpp could not create the instrumented context for per-layer timing")
        return ctx

    def prompt_ids(self, workload: Workload) -> list[int]:
        """The prompt's token ids as ``run`` builds them (checked against the context first)."""
        if workload.prompt is not None:
            ids = self.llm.tokenize(workload.prompt.encode("utf-8"), add_bos=True, special=False)
        else:
            self.check_fits(workload.synthetic_prompt_tokens or 0, workload.max_tokens)
            ids = self.synthetic_prompt(workload.synthetic_prompt_tokens or 0, workload.seed)
        self.check_fits(len(ids), workload.max_tokens)
        return ids

    def decode_feed(self, workload: Workload) -> list[int] | None:
        """The seeded tokens ``run`` feeds to decode when it does not sample (``sample=False``,
        as llama-bench's tg), or None when it samples inside the timed loop."""
        if self.sample:
            return None
        return self.synthetic_prompt(workload.max_tokens + 1, workload.seed + 1)[1:]

    def fit_context(self, tokens: int) -> None:
        """Auto n_ctx: make the context exactly as large as the workload needs (rounded up to
        ``AUTO_CTX_STEP``), as llama-bench does: a context many times larger than the run
        slowed decode by 9% here (docs/fidelity.md). Outside every timed region; the new
        context gets one throw-away evaluation like a fresh load."""
        if not self._auto_ctx:
            return
        want = -(-max(tokens, 1) // AUTO_CTX_STEP) * AUTO_CTX_STEP
        if want == self.n_ctx or tokens > self._n_ctx_train():
            return  # beyond the model's training context: check_fits says so
        lib = self._lib
        params = type(self.llm.context_params).from_buffer_copy(self.llm.context_params)
        params.n_ctx = want
        params.n_batch = min(self.config.n_batch, want)
        params.n_ubatch = min(self.config.ubatch, params.n_batch)
        ctx = lib.llama_init_from_model(self._model, params)
        if not ctx:
            raise EngineError(f"llama.cpp could not make a context of {want} tokens")
        if self._own_ctx:
            lib.llama_free(self._ctx)
        self._ctx, self._own_ctx = ctx, True
        self.context_params = params
        self.n_ctx, self.n_batch = lib.llama_n_ctx(ctx), lib.llama_n_batch(ctx)
        self._evaluate_once()
        self._info = dataclasses.replace(self._info, n_ctx=self.n_ctx, n_batch=self.n_batch)

    def _n_ctx_train(self) -> int:
        return int(self._lib.llama_model_n_ctx_train(self._model))

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """A one-line EngineError when the workload cannot fit the context."""
        if self._auto_ctx and prompt_tokens + max_tokens > self._n_ctx_train():
            raise EngineError(
                f"context too small: {prompt_tokens} prompt + {max_tokens} generated tokens > n_ctx "
                f"{self._n_ctx_train()} (the model's training context); shorten the workload"
            )
        if not self._auto_ctx and prompt_tokens + max_tokens > self.n_ctx:
            raise EngineError(
                f"context too small: {prompt_tokens} prompt + {max_tokens} generated tokens > "
                f"n_ctx {self.n_ctx}; raise --llmperf-n-ctx or shorten the workload"
            )

    def close(self) -> None:
        if getattr(self, "_own_ctx", False):
            self._lib.llama_free(self._ctx)
            self._own_ctx = False
        if getattr(self, "_sampler", None) is not None:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None
        if getattr(self, "llm", None) is not None:
            self.llm.close()


def _kv_bytes_per_element(params: Any) -> float | None:
    """Mean bytes per K/V cache element, from the context's cache types (F16 by default)."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        sizes = [GGML_QUANT_SIZES[GGMLQuantizationType(int(t))] for t in (params.type_k, params.type_v)]
    except (ImportError, ValueError, KeyError):
        return None
    return sum(type_size / block for block, type_size in sizes) / 2


def _quantization(meta: dict[str, str]) -> str | None:
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
