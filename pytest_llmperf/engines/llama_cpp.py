"""llama.cpp in process, through llama-cpp-python's low-level API.

Why not ``create_completion(stream=True)``: its chunks are held back for UTF-8 and stop
sequences, so chunk times are not token times. This engine drives ``llama_decode`` and the
native sampler itself (the timed loop: ``timed_decode`` below) and reads the clock right after each
token id is available. The library's own helpers (import, model file check, sampler, model
facts) are in ``llama_cpp_native``.

The timed loop of in-process llama.cpp: prefill, then one token per ``llama_decode`` call.

Apart from the engine because two callers drive it and must time the same work: the engine's
plain runs (``LlamaCppEngine.run``, on its own context) and per-layer timing
(``measuring.layers``, on a context with the eval callback installed). One loop, so a layer
profile's overhead ratio compares like with like. Everything the loop needs (token arrays,
batches pointing into them, the feed) is prepared before the first clock read: the timed
region holds llama.cpp's work and the few Python statements that call it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np

from ..core.errors import ConfigError, EngineError
from ..core.workload import (
    AUTO_CTX_STEP,
    MEMORY_FIELDS,
    ChatMessage,
    EngineInfo,
    NativeCounters,
    RunTrace,
    SetRequest,
    TokenLogits,
    Workload,
    chat_dicts,
    llama_arguments,
)
from ..models.gguf import embedding_lookup, gguf_file_type
from . import NOT_ONE_REQUEST, CounterSource, synthetic_text
from .capabilities import (
    Closable,
    Engine,
    FreshInstances,
    FreshLoads,
    LayerTiming,
    LlamaObject,
    SteppedRuns,
    TimedDecode,
    TokenProbabilities,
)
from .llama_cpp_native import (
    EngineConfig,
    buffer_sizes,
    check_gguf,
    context_failure,
    default_threads,
    greedy_sampler,
    import_llama_cpp,
    llama_cpp_version,
    llama_log_capture,
    mapped_file_mib,
    resolve_repack,
    with_model_facts,
)

if TYPE_CHECKING:
    import ctypes

    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_cpp import llama_batch, llama_context_p, llama_sampler_p, llama_vocab_p
    from llama_cpp.llama_types import ChatCompletionRequestMessage

    from .llama_cpp_native import Context, Sampler

#: Sampler calls per run that time sampling apart when the decode loop does not sample.
SAMPLING_PROBES = 8


#: The attribute ``with_default_params`` marks its replacement of llama-cpp-python's defaults with.
MODEL_PARAMS_MARK = "llmperf_model_params"


@contextlib.contextmanager
def with_default_params(llama_cpp: ModuleType, factory: str, **fields: object) -> Iterator[None]:
    """llama-cpp-python builds some parameters from llama.cpp's defaults (``factory``:
    ``llama_model_default_params``, ``llama_sampler_chain_default_params``) and takes no keyword
    for some of them (``use_extra_bufts``, the chain's ``no_perf``): set them on the defaults
    while the block runs (one ``Llama`` constructed, one sampler chain made)."""
    module = llama_cpp.llama_cpp
    default = getattr(module, factory)

    def with_fields() -> object:
        params = default()
        for name, value in fields.items():
            setattr(params, name, value)
        return params

    setattr(with_fields, MODEL_PARAMS_MARK, dict(fields))  # a load under way sets its own parameters
    setattr(module, factory, with_fields)
    try:
        yield
    finally:
        setattr(module, factory, default)


class MemoryFields(TypedDict, total=False):
    """``EngineInfo``'s memory fields (``MEMORY_FIELDS``) as an engine reads them."""

    kv_mib: float | None
    compute_mib: float | None
    output_mib: float | None
    model_buffer_mib: float | None
    mapped_mib: float | None
    mapped_resident_mib: float | None


class LlamaCppEngine(
    Engine, LayerTiming, TokenProbabilities, FreshLoads, LlamaObject, SteppedRuns, Closable, FreshInstances
):
    """One loaded model and context; each ``run`` is an independent request.

    ``llm`` is the ``llama_cpp.Llama`` object, available to tests; the engine clears the KV
    cache and resets it before every run, so no prompt prefix is reused between runs.

    Per-layer timing (``measuring.layers``) drives :meth:`instrumented_context`,
    :meth:`prompt_ids`, :meth:`decode_feed` and :meth:`timed_decode`; :meth:`token_logits`
    gives the next-token logits over the whole vocabulary.
    """

    # Until __init__ sets them (close() frees what a failed load left).
    llm: Llama | None = None
    _own_ctx = False
    _chat: Jinja2ChatFormatter | None = None  # the model's chat template, once messages need it
    _set_need_of: tuple[tuple[SetRequest, ...], int] | None = None  # the last prompt set and its need
    _sampler: Sampler = None
    _talk: Talk | None = None  # the conversation run under way: its replies and what the KV cache holds
    _talk_need_of: tuple[Workload, int] | None = None  # the last conversation and its need

    def __init__(
        self, model_path: str | os.PathLike[str], *, name: str | None = None, verbose: bool = False, **settings: object
    ) -> None:
        """``settings``: llama.cpp settings by name (``core.workload.LLAMA_SETTINGS``; unset: the default)."""
        path = check_gguf(model_path)
        llama_cpp = import_llama_cpp()
        self._lib = llama_cpp
        settings["threads"] = settings.get("threads") or default_threads()
        # Validates the names and the combination (cache types, quantized V without flash attention...).
        self.config = EngineConfig.named(str(path), settings)
        self.sample = self.config.sample
        use_repack, repack_note = resolve_repack(self.config.repack, gguf_file_type(path))
        values = {**self.config.settings(), "repack": use_repack}  # as llama.cpp gets them
        keywords, model_params = llama_arguments(values)
        mapped_before = mapped_file_mib(path)  # another engine of this file in this process maps it too
        started = time.perf_counter_ns()
        log: list[str] = []
        try:
            with (
                with_default_params(llama_cpp, "llama_model_default_params", **model_params),
                llama_log_capture(llama_cpp) as log,
            ):
                self.llm = llama_cpp.Llama(model_path=str(path), **keywords, no_perf=False, verbose=verbose)
        except (ValueError, RuntimeError, OSError) as exc:
            line = context_failure(path, exc, log, self.config.n_ctx)
            raise EngineError(line or f"llama.cpp could not load {path}: {exc}") from None
        load_ms = (time.perf_counter_ns() - started) / 1e6
        self._buffers = buffer_sizes(log)  # MiB by kind, of the model and its first context

        self._ctx = self.llm._ctx.ctx
        self.context_params = self.llm.context_params  # of the context in use
        self._auto_ctx = self.config.n_ctx is None
        self._own_ctx = False  # True once a context was made here for a workload (auto n_ctx)
        self._model = self.llm._model.model
        self._vocab = self.llm._model.vocab
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._eog_ids, self._prompt_ids = _vocab_tables(llama_cpp, self._vocab, self.n_vocab)
        self._sampler = self.make_sampler()
        # One throw-away evaluation: the first decode after load is several times slower, and
        # it makes llama.cpp record its own load time.
        evaluated = time.perf_counter_ns()
        self._evaluate_once()
        first_eval_ms = (time.perf_counter_ns() - evaluated) / 1e6
        native_load_ms = llama_cpp.llama_perf_context(self._ctx).t_load_ms

        lookup = embedding_lookup(path) or (None, None)
        info = EngineInfo(
            engine="llama.cpp",
            model=name or path.stem,
            model_path=str(path),
            embedding_lookup_params=lookup[0],
            embedding_lookup_bytes=lookup[1],
            **{  # every setting as llama.cpp got it, some as llama.cpp reports them
                **values,
                "n_ctx": self.n_ctx,
                "n_batch": self.n_batch,
                "n_ubatch": self.config.ubatch,
                "gpu_layers": self._offloaded(self.config.gpu_layers),
            },
            repack_note=repack_note,
            load_ms=load_ms,
            native_load_ms=float(native_load_ms),
            first_eval_ms=first_eval_ms,
            backend_version=llama_cpp_version(),
            **self._memory(path, mapped_before),
        )
        self._info = with_model_facts(llama_cpp, self.llm, info)

    @classmethod
    def from_config(cls, config: EngineConfig, *, name: str | None = None, verbose: bool = False) -> LlamaCppEngine:
        """The engine of an ``EngineConfig`` whose ``model`` is a file path (the one mapping of
        the settings' names onto this class's keywords: the pool and the engine worker use it)."""
        return cls(config.model, name=name, verbose=verbose, **config.settings())

    def fresh(self) -> LlamaCppEngine:
        """Another engine of the same settings, loaded now (a model-load sample)."""
        return LlamaCppEngine.from_config(self.config, name=self._info.model)

    def fresh_instance(self) -> LlamaCppEngine:
        """Another instance of the same settings (an A/B's next block): the model loaded again,
        a fresh context (``fresh``)."""
        return self.fresh()

    # -- setup -------------------------------------------------------------------------------

    def _offloaded(self, asked: int) -> int:
        """Layers llama.cpp offloads for ``asked`` (-1: all): none on a build without a GPU
        backend, at most the model's layers plus the output layer otherwise."""
        if not self._lib.llama_supports_gpu_offload():
            return 0
        total = int(self._lib.llama_model_n_layer(self._model)) + 1
        return total if asked < 0 else min(asked, total)

    @property
    def lib(self) -> ModuleType:
        """llama-cpp-python's low-level bindings (``llama_cpp``), for callers driving a context."""
        return self._lib

    def make_sampler(self) -> llama_sampler_p:
        """Greedy sampling with every end-of-generation token banned: runs have equal length.
        The caller owns it (``lib.llama_sampler_free``)."""
        return greedy_sampler(self._lib, self.n_vocab, self._eog_ids)

    def _clear(self) -> None:
        self._keep(0)

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
        return self._run(workload, run_index, None)

    def run_stepped(self, workload: Workload, run_index: int, pause: Callable[[], None]) -> RunTrace:
        """``run``, pausing before the prompt and after each token (``SteppedRuns``): nothing
        runs in llama.cpp between this loop's steps, so a pause moves no work out of a step."""
        return self._run(workload, run_index, pause)

    def _run(self, workload: Workload, run_index: int, pause: Callable[[], None] | None) -> RunTrace:
        if workload.shared_prefix_tokens:  # this engine clears its KV cache before every run
            raise ConfigError("shared_prefix_tokens measures a server's prompt cache: use a served model (an endpoint)")
        if workload.prompt_cache != "cold":
            raise ConfigError(
                "prompt_cache='warm' measures the Llama your own code drives (llmperf.measure(fn)); the plugin's "
                "engine evaluates every prompt (a served model's prefix cache: shared_prefix_tokens)"
            )
        if workload.turn is not None:
            return self._turn(workload, run_index, pause)
        lib = self._lib
        need = self._set_need(workload)
        workload = workload.request(run_index)  # a prompt set's request of this run
        max_tokens = workload.max_tokens
        prompt_ids, tokenize_ns = self._prompt(workload)
        self.fit_context(need or len(prompt_ids) + max_tokens)
        self.check_fits(len(prompt_ids), max_tokens)
        # As llama-bench's tg unless the engine samples: each step feeds a seeded token, no
        # sampler runs between the clock reads (sampling is timed apart: ``_time_sampling``).
        feed = self.decode_feed(workload)
        self._clear()
        timed = timed_decode(
            lib, self._ctx, prompt_ids, max_tokens, self.n_batch, feed=feed, sampler=self._sampler, pause=pause
        )
        return self._trace(timed, len(prompt_ids), tokenize_ns, feed)

    def _trace(
        self,
        timed: TimedDecode,
        prompt_tokens: int,
        tokenize_ns: int,
        feed: list[int] | None,
        reused: int | None = None,
    ) -> RunTrace:
        """A run's trace from its timed loop and llama.cpp's counters (read after it)."""
        lib = self._lib
        perf = lib.llama_perf_context(self._ctx)
        if feed is not None:
            self._time_sampling(len(timed.token_ns))
        sampled = lib.llama_perf_sampler(self._sampler)
        return RunTrace(
            start_ns=timed.start_ns,
            prefill_done_ns=timed.prefill_done_ns,
            token_ns=timed.token_ns,
            prompt_tokens=prompt_tokens,
            tokenize_ns=tokenize_ns,
            prompt_reused_tokens=reused,
            native=NativeCounters(
                prefill_ms=float(perf.t_p_eval_ms),
                prefill_tokens=int(perf.n_p_eval),
                decode_ms=float(perf.t_eval_ms),
                decode_tokens=int(perf.n_eval),
                sample_ms=float(sampled.t_sample_ms),
                sample_count=int(sampled.n_sample),
                sampled_in_run=feed is None,
            ),
            token_ids=timed.token_ids,
        )

    # -- conversations: turn by turn, the KV cache kept between the turns of a run --------------

    def _turn(self, workload: Workload, run_index: int, pause: Callable[[], None] | None) -> RunTrace:
        """Turn ``workload.turn`` of run ``run_index`` of a conversation: the chat of the system
        message, the user turns so far and this engine's replies to the earlier ones, rendered
        through the model's template; the KV cache holds the previous turn's prompt and reply, so
        only the tokens past their common prefix are evaluated (turn 1: cleared first)."""
        assert workload.conversation is not None and workload.turn is not None
        k, talk = workload.turn, self._talk
        need = self._talk_need(workload)
        whole = dataclasses.replace(workload, turn=None)
        if k == 1:
            self.fit_context(need)
            talk = Talk(whole, run_index, (), ())
        elif talk is None or (talk.workload, talk.run_index, len(talk.replies)) != (whole, run_index, k - 1):
            raise EngineError(
                f"conversation turn {k} of run {run_index} asked without its turn {k - 1} just before on this engine"
            )
        prompt_ids, tokenize_ns = self._chat_ids(workload.conversation.messages(talk.replies))
        self.check_fits(len(prompt_ids), workload.max_tokens)
        # At least two tokens evaluated: the last prompt token's logits, and never a one-token
        # prompt (llama.cpp books it as decode, ``split_prompt``).
        reused = max(min(common_prefix(talk.cached, prompt_ids), len(prompt_ids) - 2), 0)
        feed = self.decode_feed(workload, k)
        self._keep(reused)
        timed = timed_decode(
            self._lib,
            self._ctx,
            prompt_ids[reused:],
            workload.max_tokens,
            self.n_batch,
            feed=feed,
            sampler=self._sampler,
            pause=pause,
        )
        assert self.llm is not None
        reply = self.llm.detokenize(list(timed.token_ids)).decode("utf-8", errors="replace")
        # The KV cache now holds the prompt and every generated token but the last (never decoded).
        self._talk = Talk(whole, run_index, (*talk.replies, reply), (*prompt_ids, *timed.token_ids[:-1]))
        return self._trace(timed, len(prompt_ids), tokenize_ns, feed, reused)

    def _keep(self, tokens: int) -> None:
        """The KV cache's first ``tokens`` positions kept, the rest dropped (0: cleared), and the
        counters and sampler reset for the run."""
        lib = self._lib
        if tokens == 0:
            self._talk = None  # a conversation's turns go on only from what its previous turn left
            assert self.llm is not None  # loaded: __init__ finished
            lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
            self.llm.reset()  # keep the Llama object's own token bookkeeping in step
        elif not lib.llama_memory_seq_rm(lib.llama_get_memory(self._ctx), 0, tokens, -1):
            raise EngineError(f"llama.cpp could not drop the KV cache past position {tokens}")
        lib.llama_sampler_reset(self._sampler)
        lib.llama_perf_context_reset(self._ctx)
        lib.llama_perf_sampler_reset(self._sampler)

    def _talk_need(self, workload: Workload) -> int:
        """A conversation's context need (its last turn: the whole chat, each reply at most twice
        its ``max_tokens`` as text tokenized again, and its reply), checked against the context
        once per conversation, before its first run (an EngineError, one line)."""
        c = workload.conversation
        assert c is not None
        if self._talk_need_of is None or self._talk_need_of[0] != workload:
            t = len(c.turns)
            chat = len(self._chat_ids(c.messages([""] * (t - 1)))[0])
            replies = 2 * workload.max_tokens * (t - 1)
            try:
                self.check_fits(chat + replies, workload.max_tokens)
            except EngineError as exc:
                raise EngineError(
                    f"conversation of {t} turns (its chat {chat} tokens, up to {replies} for its replies): {exc}"
                ) from None
            self._talk_need_of = (workload, chat + replies + workload.max_tokens)
        return self._talk_need_of[1]

    def _chat_ids(self, messages: tuple[ChatMessage, ...]) -> tuple[list[int], int]:
        """Chat messages rendered through the model's template and tokenized, and the ns spent."""
        assert self.llm is not None  # loaded: __init__ finished
        render = self._chat_formatter()
        chat = cast("list[ChatCompletionRequestMessage]", chat_dicts(messages))
        before = time.perf_counter_ns()
        ids = chat_prompt_ids(self.llm, render, chat)
        return ids, time.perf_counter_ns() - before

    def timed_decode(
        self, ctx: Context, prompt_ids: Sequence[int], max_tokens: int, *, feed: Sequence[int] | None, sampler: Sampler
    ) -> TimedDecode:
        """One timed run on ``ctx``, cleared by the caller: this engine's context (``run``) or
        one from :meth:`instrumented_context` (per-layer timing): the same loop either way.
        ``feed``: :meth:`decode_feed`'s tokens (None: sample with ``sampler`` in the loop)."""
        return timed_decode(self._lib, ctx, prompt_ids, max_tokens, self.n_batch, feed=feed, sampler=sampler)

    def _time_sampling(self, max_tokens: int) -> None:
        """Run the sampler (greedy over the vocabulary, end-of-generation banned) on the last
        logits, outside the timed region, so llama.cpp's sampler counters give the sampling
        cost per token that a generating server adds on top of decode."""
        lib = self._lib
        for _ in range(min(max_tokens, SAMPLING_PROBES)):
            lib.llama_sampler_sample(self._sampler, self._ctx, -1)

    def instrumented_context(self, cb_eval: object, tokens: int) -> llama_context_p:
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

    def _prompt(self, workload: Workload) -> tuple[list[int], int]:
        """The prompt's token ids and the ns spent making them from text (timed apart): a literal
        prompt tokenized, chat messages rendered through the model's template and tokenized."""
        assert self.llm is not None  # loaded: __init__ finished
        if workload.conversation is not None:
            raise EngineError(NOT_ONE_REQUEST)
        if workload.messages is not None:
            return self._chat_ids(workload.messages)
        if workload.prompt is not None:
            text = workload.prompt.encode("utf-8")
            before = time.perf_counter_ns()
            ids = self.llm.tokenize(text, add_bos=True, special=False)
            return ids, time.perf_counter_ns() - before
        n_prompt = workload.synthetic_prompt_tokens or 0
        self.check_fits(n_prompt, workload.max_tokens)  # before building the prompt: it may be huge
        return self.synthetic_prompt(n_prompt, workload.seed), 0

    def _set_need(self, workload: Workload) -> int | None:
        """A prompt set's largest request, prompt + generated tokens (None: no set), so that an
        auto n_ctx is one context for every run of the set; counted once per set, at its first
        run, when every request is checked against the context (``check_fits``)."""
        if workload.prompt_set is None:
            return None
        if self._set_need_of is None or self._set_need_of[0] != workload.prompt_set:
            sizes = [(len(self._prompt(w)[0]), w.max_tokens) for w in workload.each_request()]
            for prompt_tokens, max_tokens in sizes:
                self.check_fits(prompt_tokens, max_tokens)
            self._set_need_of = (workload.prompt_set, max(p + n for p, n in sizes))
        return self._set_need_of[1]

    def _chat_formatter(self) -> Jinja2ChatFormatter:
        """The model's chat template (GGUF ``tokenizer.chat_template``) as llama-cpp-python's
        ``create_chat_completion`` renders it, compiled once; a ConfigError naming the model
        when it has none."""
        if self._chat is None:
            assert self.llm is not None
            self._chat = chat_formatter(self.llm, self._info.model)
        return self._chat

    def prompt_ids(self, workload: Workload) -> list[int]:
        """The prompt's token ids as ``run`` builds them (checked against the context first); a
        prompt set's first run's."""
        workload = workload.request(0)
        ids = self._prompt(workload)[0]
        self.check_fits(len(ids), workload.max_tokens)
        return ids

    def decode_feed(self, workload: Workload, turn: int = 0) -> list[int] | None:
        """The seeded tokens ``run`` feeds to decode when it does not sample (``sample=False``,
        as llama-bench's tg; a conversation's ``turn``: a different reply each turn), or None
        when it samples inside the timed loop."""
        if self.sample:
            return None
        return self.synthetic_prompt(workload.max_tokens + 1, workload.seed + 1 + turn)[1:]

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
        assert self.llm is not None  # loaded: __init__ finished
        params = type(self.llm.context_params).from_buffer_copy(self.llm.context_params)
        params.n_ctx = want
        params.n_batch = min(self.config.n_batch, want)
        params.n_ubatch = min(self.config.ubatch, params.n_batch)
        with llama_log_capture(lib) as log:
            ctx = lib.llama_init_from_model(self._model, params)
        if not ctx:
            raise EngineError(f"llama.cpp could not make a context of {want} tokens")
        self._buffers = {**self._buffers, **buffer_sizes(log)}  # this context's KV, compute, output
        if self._own_ctx:
            lib.llama_free(self._ctx)
        self._ctx, self._own_ctx = ctx, True
        self.context_params = params
        self.n_ctx, self.n_batch = lib.llama_n_ctx(ctx), lib.llama_n_batch(ctx)
        self._evaluate_once()
        self._info = dataclasses.replace(self._info, n_ctx=self.n_ctx, n_batch=self.n_batch, **self._memory())

    def fit_handed(self, workload: Workload) -> None:
        """Before a callable measures ``workload`` on the Llama this engine hands out
        (``llmperf_llm``): every request's prompt as the callable is given it (text tokenized,
        messages rendered through the chat template; a conversation's last turn, ``_talk_need``)
        plus its ``max_tokens`` checked against the
        context (``check_fits``: a set n_ctx names the option to raise), and under auto n_ctx the
        Llama's own context made as large as the largest needs (rounded up to ``AUTO_CTX_STEP``,
        never below it: what it was loaded with), as ``fit_context`` sizes this engine's. Outside
        every timed region. A closed engine (a cold load released it) is left alone."""
        if self.llm is None or getattr(self.llm._ctx, "ctx", None) is None:
            return  # closed: its Llama's memory is freed, and the callable cannot drive it either
        need = 0
        for request in workload.each_request():
            if request.conversation is not None:  # its last turn: the whole chat and the replies
                need = max(need, self._talk_need(request))
                continue
            prompt_tokens = self._given_tokens(request)
            self.check_fits(prompt_tokens, request.max_tokens)
            need = max(need, prompt_tokens + request.max_tokens)
        want = max(-(-need // AUTO_CTX_STEP), 1) * AUTO_CTX_STEP
        if self._auto_ctx and want != self.llm.n_ctx():
            self._refit_llm(want)

    def _given_tokens(self, workload: Workload) -> int:
        """The prompt tokens of what a callable is given for ``workload`` (``CallableEngine``):
        its messages or prompt as this engine reads them, a synthetic prompt's text tokenized."""
        assert self.llm is not None
        if workload.messages is not None and not self.llm.metadata.get("tokenizer.chat_template"):
            # The callable renders them its own way (the model has no template): their text, at least.
            text = "\n".join(content for _, content in workload.messages)
        elif workload.messages is not None or workload.prompt is not None:
            return len(self._prompt(workload)[0])
        else:
            text = synthetic_text(workload.synthetic_prompt_tokens or 0, workload.seed)
        return len(self.llm.tokenize(text.encode("utf-8")))

    def _refit_llm(self, n_ctx: int) -> None:
        """The Llama's own context replaced by one of ``n_ctx`` tokens (its other parameters
        kept), llama-cpp-python's bookkeeping sized to it, the old one freed; this engine's runs
        follow it where they used the Llama's context. One throw-away evaluation, as a load."""
        from llama_cpp import _internals

        llm, lib = self.llm, self._lib
        assert llm is not None
        was, llm.context_params.n_ctx = llm.context_params.n_ctx, n_ctx
        with llama_log_capture(lib) as log:
            try:
                made = _internals.LlamaContext(model=llm._model, params=llm.context_params, verbose=llm.verbose)
            except ValueError:
                llm.context_params.n_ctx = was
                raise EngineError(f"llama.cpp could not make a context of {n_ctx} tokens") from None
        old, llm._ctx = llm._ctx, llm._stack.enter_context(contextlib.closing(made))
        n_rows = n_ctx if llm._logits_all else llm.n_batch
        llm.input_ids = np.ndarray((n_ctx,), dtype=np.intc)
        llm.scores = np.ndarray((n_rows, llm._n_vocab), dtype=np.single)
        llm._n_ctx = llm.n_ctx()
        if not self._own_ctx:  # this engine's runs were on the Llama's context
            self._ctx, self.n_ctx = made.ctx, lib.llama_n_ctx(made.ctx)
            self._buffers = {**self._buffers, **buffer_sizes(log)}
            self._info = dataclasses.replace(self._info, n_ctx=self.n_ctx, **self._memory())
        old.close()
        ids = (lib.llama_token * 2)(*self.synthetic_prompt(2, seed=0))
        if lib.llama_decode(made.ctx, lib.llama_batch_get_one(ids, 2)) != 0:
            raise EngineError("llama.cpp failed its first evaluation of the refitted context")
        lib.llama_synchronize(made.ctx)
        lib.llama_memory_clear(lib.llama_get_memory(made.ctx), True)
        llm.reset()

    def _memory(self, path: Path | None = None, mapped_before: tuple[float, float] | None = None) -> MemoryFields:
        """EngineInfo's memory fields: llama.cpp's reported buffers of the model and of the
        context in use, and (``path``: after load) the model file's mapping that this load made:
        the process's mappings of the file less those it had before (``mapped_before``)."""
        b = self._buffers
        out: MemoryFields = {"kv_mib": b.get("kv"), "compute_mib": b.get("compute"), "output_mib": b.get("output")}
        if path is not None:
            mapped = mapped_file_mib(path)
            if mapped is not None and mapped_before is not None:
                mapped = (mapped[0] - mapped_before[0], max(mapped[1] - mapped_before[1], 0.0))
            out.update(
                {
                    "model_buffer_mib": b.get("model"),
                    "mapped_mib": mapped[0] if mapped and mapped[0] > 0 else None,
                    "mapped_resident_mib": mapped[1] if mapped and mapped[0] > 0 else None,
                }
            )
        return out

    def _n_ctx_train(self) -> int:
        return int(self._lib.llama_model_n_ctx_train(self._model))

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """A one-line EngineError when the workload cannot fit the context."""
        n_ctx = self._n_ctx_train() if self._auto_ctx else self.n_ctx
        if prompt_tokens + max_tokens > n_ctx:
            todo = " (the model's training context);" if self._auto_ctx else "; raise --llmperf-n-ctx or"
            raise EngineError(
                f"context too small: {prompt_tokens} prompt + {max_tokens} generated tokens > n_ctx {n_ctx}{todo} "
                "shorten the workload"
            )

    # -- token probabilities (output agreement, measuring.agreement): never inside a timed run --

    def token_logits(
        self, workload: Workload, forced: Sequence[int] | None = None, prompt_ids: Sequence[int] | None = None
    ) -> TokenLogits:
        """The workload's prompt (or ``prompt_ids``), this model's greedy continuation of
        ``max_tokens`` ids (end of generation banned, as the runs' sampler does) and the
        next-token logits at each position of ``forced`` (teacher forcing, one batch; None: its
        own greedy ids). On this engine's context, after its runs; the KV cache is cleared
        before and after, as ``run`` does."""
        lib, n_tokens = self._lib, workload.max_tokens
        prompt = list(prompt_ids) if prompt_ids is not None else self.prompt_ids(workload)
        self.check_fits(len(prompt), n_tokens)
        self.fit_context(len(prompt) + n_tokens)
        if forced is not None and len(forced) != n_tokens:
            raise ValueError(f"token_logits: {len(forced)} forced ids for {n_tokens} positions")
        banned = np.asarray(self._eog_ids, dtype=np.int64)
        self._clear()
        try:
            greedy: list[int] = []
            row = self._logit_rows(prompt, 0, len(prompt) - 1)[0]
            for i in range(n_tokens):
                if i:
                    row = self._logit_rows([greedy[-1]], len(prompt) + i - 1, 0)[0]
                row[banned] = -np.inf
                greedy.append(int(np.argmax(row)))
            lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
            ids = list(prompt) + list(greedy if forced is None else forced)[:-1]
            rows = self._logit_rows(ids, 0, len(prompt) - 1)
        finally:
            self._clear()
        return TokenLogits(tuple(prompt), tuple(greedy), np.stack(rows))

    def _logit_rows(self, ids: Sequence[int], pos0: int, first: int) -> list[np.ndarray]:
        """Decode ``ids`` at positions ``pos0``.. (in ``n_batch`` chunks) and copy the logits
        after each of ``ids[first:]`` (float32, one row per position)."""
        lib, rows = self._lib, []
        batch = lib.llama_batch_init(self.n_batch, 0, 1)
        try:
            for start in range(0, len(ids), self.n_batch):
                chunk = ids[start : start + self.n_batch]
                batch.n_tokens = len(chunk)
                for j, token in enumerate(chunk):
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = token, pos0 + start + j, 1
                    batch.seq_id[j][0] = 0
                    batch.logits[j] = start + j >= first
                if lib.llama_decode(self._ctx, batch) != 0:
                    raise EngineError(f"llama_decode failed reading token probabilities ({len(ids)} tokens)")
                for j in range(max(first - start, 0), len(chunk)):
                    scores = lib.llama_get_logits_ith(self._ctx, j)
                    rows.append(np.ctypeslib.as_array(scores, shape=(self.n_vocab,)).copy())
        finally:
            lib.llama_batch_free(batch)
        return rows

    def close(self) -> None:
        if self._own_ctx:
            self._lib.llama_free(self._ctx)
            self._own_ctx = False
        if self._sampler is not None:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None
        if self.llm is not None:
            self.llm.close()


def chat_prompt_ids(llm: Llama, render: Jinja2ChatFormatter, messages: list[ChatCompletionRequestMessage]) -> list[int]:
    """Chat messages' prompt ids as llama-cpp-python's ``create_chat_completion`` makes them:
    rendered through ``render`` (``chat_formatter``'s), the template writing the BOS, its special
    tokens' text read as the tokens."""
    return llm.tokenize(render(messages=messages).prompt.encode("utf-8"), add_bos=False, special=True)


def chat_formatter(llm: Llama, model: str) -> Jinja2ChatFormatter:
    """``llm``'s chat template (GGUF ``tokenizer.chat_template``) with its BOS and EOS text, as
    llama-cpp-python builds its handler; a model without one: a ConfigError, one line."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise ConfigError(
            f"the model {model} has no chat template (tokenizer.chat_template in its GGUF): messages are "
            "rendered through it; give a prompt instead, or a model with a chat template"
        )
    vocab = llm._model
    return Jinja2ChatFormatter(
        template=template,
        eos_token=vocab.token_get_text(llm.token_eos()),
        bos_token=vocab.token_get_text(llm.token_bos()),
    )


@dataclass(frozen=True)
class Talk:
    """A conversation's run on the engine so far: its workload and run index, the replies made
    to its turns and the token ids the KV cache holds (the last turn's prompt and reply)."""

    workload: Workload
    run_index: int
    replies: tuple[str, ...]
    cached: tuple[int, ...]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _vocab_tables(lib: ModuleType, vocab: llama_vocab_p, n_vocab: int) -> tuple[list[int], np.ndarray]:
    """The vocabulary's end-of-generation ids, and the ids a synthetic prompt may use (neither
    control nor end-of-generation tokens)."""
    eog_ids = [t for t in range(n_vocab) if lib.llama_vocab_is_eog(vocab, t)]
    prompt_ids = np.array(
        [t for t in range(n_vocab) if not lib.llama_vocab_is_control(vocab, t) and t not in eog_ids], dtype=np.int64
    )
    return eog_ids, prompt_ids


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


def _decode_buffers(
    lib: ModuleType,
    prompt_ids: Sequence[int],
    max_tokens: int,
    n_batch: int,
    feed: Sequence[int] | None,
    sampler: Sampler,
) -> tuple[list[ctypes.Array[ctypes.c_int32]], list[llama_batch], ctypes.Array[ctypes.c_int32], llama_batch, list[int]]:
    """What a timed loop needs made before its first clock read: the prompt's token arrays
    (``split_prompt``'s chunks) and a batch over each (the arrays must outlive the batches that
    point into them), a one-token array and its batch, and the token ids (the feed's, or zeros
    the sampler fills)."""
    if feed is None and sampler is None:
        raise ValueError("timed_decode needs a feed or a sampler")
    arrays = [(lib.llama_token * n)(*prompt_ids[s : s + n]) for s, n in split_prompt(len(prompt_ids), n_batch)]
    prompt_batches = [lib.llama_batch_get_one(a, len(a)) for a in arrays]
    one = (lib.llama_token * 1)()
    token_ids = list(feed) if feed is not None else [0] * max_tokens
    return arrays, prompt_batches, one, lib.llama_batch_get_one(one, 1), token_ids


def _timed_prompt(
    lib: ModuleType, ctx: Context, prompt_batches: Sequence[llama_batch], n_prompt: int
) -> tuple[int, int]:
    """The prompt's batches evaluated: (the clock before the first, the clock once its logits are ready)."""
    clock = time.perf_counter_ns
    start = clock()
    for batch in prompt_batches:
        if lib.llama_decode(ctx, batch) != 0:
            raise EngineError(f"llama_decode failed on the prompt ({n_prompt} tokens)")
    lib.llama_synchronize(ctx)
    return start, clock()


def timed_decode(
    lib: ModuleType,
    ctx: Context,
    prompt_ids: Sequence[int],
    max_tokens: int,
    n_batch: int,
    *,
    feed: Sequence[int] | None,
    sampler: Sampler = None,
    pause: Callable[[], None] | None = None,
) -> TimedDecode:
    """Prefill ``prompt_ids`` on ``ctx`` (cleared by the caller), then generate ``max_tokens``.

    ``feed``: the tokens decode is fed, one per step, no sampler between the clock reads (as
    llama-bench's tg); None: greedy sampling with ``sampler`` inside the timed loop.
    ``pause``: called before the prompt and before each later step (``SteppedRuns``); the
    time from a token's clock read to the end of the pause after it is taken out of every
    later clock reading.
    """
    if pause is not None:
        return _stepped_decode(lib, ctx, prompt_ids, max_tokens, n_batch, feed=feed, sampler=sampler, pause=pause)
    # The arrays must outlive the batches that point into them (kept in ``_arrays``).
    _arrays, prompt_batches, one, batch_one, token_ids = _decode_buffers(
        lib, prompt_ids, max_tokens, n_batch, feed, sampler
    )
    decode, sample, sync = lib.llama_decode, lib.llama_sampler_sample, lib.llama_synchronize
    clock = time.perf_counter_ns
    token_ns = [0] * max_tokens
    if feed is not None:
        fed = (lib.llama_token * max_tokens)(*token_ids)

    start, prefill_done = _timed_prompt(lib, ctx, prompt_batches, len(prompt_ids))
    if feed is None:
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
            one[0] = fed[i - 1]
            if decode(ctx, batch_one) != 0:
                raise EngineError(f"llama_decode failed at generated token {i + 1}")
            sync(ctx)
            token_ns[i] = clock()
    return TimedDecode(start, prefill_done, tuple(token_ns), tuple(token_ids))


def _stepped_decode(
    lib: ModuleType,
    ctx: Context,
    prompt_ids: Sequence[int],
    max_tokens: int,
    n_batch: int,
    *,
    feed: Sequence[int] | None,
    sampler: Sampler,
    pause: Callable[[], None],
) -> TimedDecode:
    """``timed_decode``'s steps one at a time, ``pause()`` before each (its own loop: the plain
    one keeps no pause check between its clock reads)."""
    _arrays, prompt_batches, one, batch_one, token_ids = _decode_buffers(
        lib, prompt_ids, max_tokens, n_batch, feed, sampler
    )
    clock = time.perf_counter_ns
    token_ns = [0] * max_tokens
    pause()
    start, prefill_done = _timed_prompt(lib, ctx, prompt_batches, len(prompt_ids))
    if feed is None:
        token_ids[0] = lib.llama_sampler_sample(sampler, ctx, -1)
    token_ns[0] = prefill_done if feed is not None else clock()
    paused_ns = 0
    for i in range(1, max_tokens):
        held = clock()
        pause()
        paused_ns += clock() - held
        one[0] = token_ids[i - 1]
        if lib.llama_decode(ctx, batch_one) != 0:
            raise EngineError(f"llama_decode failed at generated token {i + 1}")
        if feed is None:
            token_ids[i] = lib.llama_sampler_sample(sampler, ctx, -1)
        else:
            lib.llama_synchronize(ctx)
        token_ns[i] = clock() - paused_ns
    return TimedDecode(start, prefill_done, tuple(token_ns), tuple(token_ids))


# -- the counters of a Llama a measured callable drives ------------------------------------------


@dataclass(frozen=True)
class LlamaReading:
    """llama.cpp's cumulative counters of one ``llama_cpp.Llama`` at one moment: its context's
    prompt evaluation and evaluation (``llama_perf_context``, counts as llama.cpp keeps them)
    and the sampler chain the Llama held then (llama-cpp-python makes one per ``generate``)
    with that chain's counters."""

    prefill_ms: float
    prefill_tokens: int
    decode_ms: float
    decode_tokens: int
    sampler: object = None  # llama-cpp-python's LlamaSampler (kept: compared by identity)
    sample_ms: float = 0.0
    sample_count: int = 0


class LlamaCounters(CounterSource["LlamaReading | None"]):
    """llama.cpp's own counters of a ``llama_cpp.Llama`` that a measured callable drives (the
    fixtures' ``llmperf_llm``), read around each of the callable's runs: ``read()`` before the
    run's first clock read and after its last one, never between them; ``between(before,
    after)`` is the run's ``NativeCounters``, or None when the counters did not move (the
    callable did not call this Llama).

    llama.cpp reports a count of 0 as 1 (``llama_perf_context`` clamps it); a count of 1 with
    no time is read as 0. llama-cpp-python's sampler chain keeps no time (its default
    ``no_perf``): the sampling time is then None, part of the time outside llama.cpp. A prompt
    that llama-cpp-python's prompt cache already holds is not evaluated again: the counters
    say so (fewer prompt tokens; the token it replays counts as an evaluation)."""

    SOURCE = "llama_perf_context (the fixtures' Llama)"

    def __init__(self, llm: Llama, info: EngineInfo | None = None) -> None:
        self.llm = llm
        self._lib = import_llama_cpp()
        self.info = info

    def memory(self) -> dict[str, float | None]:
        """The memory figures the Llama's engine reports (``info``), for the callable's table."""
        info = self.info
        return {} if info is None else {name: getattr(info, name) for name in MEMORY_FIELDS}

    def read(self) -> LlamaReading | None:
        """The counters now (None: the Llama is closed, or a llama-cpp-python without the
        context and sampler attributes of 0.3.x: then nothing is split)."""
        lib, llm = self._lib, self.llm
        # llama-cpp-python's private attributes (0.3.x): read defensively, a run must not fail on them.
        ctx = getattr(getattr(llm, "_ctx", None), "ctx", None)
        if ctx is None:
            return None
        perf = lib.llama_perf_context(ctx)
        chain = getattr(llm, "_sampler", None)
        chain_ptr = getattr(chain, "sampler", None)
        sampled = lib.llama_perf_sampler(chain_ptr) if chain_ptr is not None else None
        return LlamaReading(
            prefill_ms=float(perf.t_p_eval_ms),
            prefill_tokens=_unclamped(int(perf.n_p_eval), perf.t_p_eval_ms),
            decode_ms=float(perf.t_eval_ms),
            decode_tokens=_unclamped(int(perf.n_eval), perf.t_eval_ms),
            sampler=chain,
            sample_ms=float(sampled.t_sample_ms) if sampled is not None else 0.0,
            sample_count=int(sampled.n_sample) if sampled is not None else 0,
        )

    def between(self, before: LlamaReading | None, after: LlamaReading | None) -> NativeCounters | None:
        """What llama.cpp did between two readings; None when it did nothing (or the Llama closed)."""
        if before is None or after is None:
            return None
        prefill_tokens = after.prefill_tokens - before.prefill_tokens
        decode_tokens = after.decode_tokens - before.decode_tokens
        if prefill_tokens <= 0 and decode_tokens <= 0:
            return None
        sample_ms, sample_count = sampler_time(before, after)
        return NativeCounters(
            prefill_ms=after.prefill_ms - before.prefill_ms,
            prefill_tokens=max(prefill_tokens, 0),
            decode_ms=after.decode_ms - before.decode_ms,
            decode_tokens=max(decode_tokens, 0),
            sample_ms=sample_ms,
            sample_count=sample_count,
            sampled_in_run=True,
            source=self.SOURCE,
        )


def _unclamped(count: int, ms: float) -> int:
    """llama.cpp's count as kept: it reports 0 as 1, and one real evaluation takes time."""
    return 0 if count == 1 and ms == 0 else count


def sampler_time(before: LlamaReading, after: LlamaReading) -> tuple[float | None, int]:
    """The sampler's time and calls between two readings: the chain held after the run (a new
    one per ``generate`` call), less what it had counted before if it is the same chain. No time
    kept (the chain's ``no_perf``) or no chain: None."""
    if after.sampler is None:
        return None, 0
    same = after.sampler is before.sampler
    ms = after.sample_ms - (before.sample_ms if same else 0.0)
    count = after.sample_count - (before.sample_count if same else 0)
    return (ms if after.sample_ms > 0 and count > 0 else None), max(count, 0)
