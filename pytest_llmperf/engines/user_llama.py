"""The ``llama_cpp.Llama`` objects a measured callable drives, measured like the plugin's engine.

Found without the user passing them: every ``Llama`` alive when a measurement starts (one scan
of the garbage collector's objects, the first time) and every one made afterwards
(``Llama.__init__`` is wrapped once: a weak set of instances, and the CPU repack guard the
plugin's engine has, ``resolve_repack``, applied to each new quantized model).

Around each run of a callable (``LlamaWatch.arm`` before its first clock read, ``disarm`` after
its last), for each open ``Llama``:

- **cold** (the default, ``prompt_cache="cold"``): what the previous run left is cleared, as the
  plugin's engine clears its own before every run: llama-cpp-python's token bookkeeping
  (``reset``, so ``generate`` finds no prefix to reuse), llama.cpp's KV cache
  (``llama_memory_clear``) and, for the run, a ``LlamaCache`` the user set (put back after it).
  ``warm`` keeps all of it: the measurement then says what the cache gives.
- its ``generate``, ``eval``, ``sample`` and ``tokenize`` are wrapped on the instance for the
  run (removed after it): the prompt's token count as ``generate`` was given it, the tokens
  llama.cpp evaluated of it (the first ``eval``), the clock when its logits were ready, llama.cpp's
  counters read right then (so its prompt and its decode are read over exactly the evaluations
  of each), each token's clock when ``sample`` returned it (where it was made, not when the
  stream delivered it), the time in ``sample`` (llama.cpp's sampler chain) and, inside it, in the
  user's Python logits processors, and the time in stopping criteria.

Inside the timed region this adds, per token, one Python call frame and two clock reads around
``sample``, one frame around ``eval``; once per run, inside TTFT, a synchronize llama.cpp's sampler
would make a moment later anyway and one reading of llama.cpp's counters (microseconds; one more
per other Llama the process holds, whose evaluations before the first token are llama.cpp's time
too), so the
prompt's and the decode's counters are apart (``benchmarks/user_path.py`` prints the cost per
token and the TTFT against the marker-only TTFT)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn, TypedDict, cast

from ..core.errors import EngineError
from ..core.workload import AUTO_CTX_STEP, EngineInfo, LlamaRun, NativeCounters, RunTrace, Workload, chat_dicts
from ..models.gguf import gguf_file_type
from . import RunWatch, synthetic_text
from .capabilities import Engine, LayerTiming, TimedDecode
from .llama_cpp import (
    MODEL_PARAMS_MARK,
    LlamaCounters,
    LlamaReading,
    chat_formatter,
    chat_prompt_ids,
    sampler_time,
    timed_decode,
    with_default_params,
)
from .llama_cpp_native import (
    buffer_sizes,
    greedy_sampler,
    import_llama_cpp,
    llama_cpp_version,
    llama_log_capture,
    mapped_file_mib,
    resolve_repack,
    with_model_facts,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import numpy as np
    import numpy.typing as npt
    from llama_cpp import Llama
    from llama_cpp.llama_cache import BaseLlamaCache
    from llama_cpp.llama_cpp import llama_context_p, llama_context_params, llama_model_params, llama_sampler_p
    from llama_cpp.llama_types import ChatCompletionRequestMessage

    from .llama_cpp_native import Context, Sampler

#: Runs in which the callable made a new Llama before that is one line (the first may be a lazy load).
MAX_RUNS_WITH_NEW = 2

#: The instance methods wrapped for a run (removed after it).
WRAPPED = ("generate", "eval", "sample", "tokenize", "_init_sampler")

_SEEN: weakref.WeakSet[Llama] = weakref.WeakSet()
#: llama.cpp's buffers (MiB by kind, from its log while the Llama loaded) of each Llama made
#: after the hook, or handed over by the engine that made it (``LlamaWatch.know``).
_BUFFERS: weakref.WeakKeyDictionary[Llama, dict[str, float]] = weakref.WeakKeyDictionary()
#: llama.cpp's buffer kinds (``buffer_sizes``) and the ``EngineInfo`` field of each.
BUFFER_FIELDS = {"kv": "kv_mib", "compute": "compute_mib", "output": "output_mib", "model": "model_buffer_mib"}
_MADE = [0]  # Llamas made since the hook (a run that made one is told: ``LlamaWatch``)
_HOOKED: list[type[Llama]] = []  # the Llama classes whose __init__ is wrapped


def live_llamas() -> list[Llama]:
    """Every open ``llama_cpp.Llama`` of this process (in no particular order)."""
    _hook()
    return [llm for llm in list(_SEEN) if _is_open(llm)]


def _is_open(llm: Llama) -> bool:
    return getattr(getattr(llm, "_ctx", None), "ctx", None) is not None


def _hook() -> None:
    """Once per ``Llama`` class (llama_cpp imported anew, as pytester's in-process sessions do,
    is another class): the Llamas alive now (gc), and ``Llama.__init__`` wrapped to add every
    later one."""
    llama_cpp = import_llama_cpp()
    cls = llama_cpp.Llama
    if any(hooked is cls for hooked in _HOOKED):
        return
    _SEEN.update(obj for obj in gc.get_objects() if isinstance(obj, cls))
    original = cls.__init__

    @functools.wraps(original)
    def init(self: Llama, *args: object, **kwargs: object) -> None:
        path = kwargs.get("model_path", args[0] if args else None)
        with _repack_guard(llama_cpp, path), llama_log_capture(llama_cpp) as log:
            original(self, *args, **kwargs)
        _SEEN.add(self)
        _BUFFERS[self] = buffer_sizes(log)
        _MADE[0] += 1

    cls.__init__ = init
    _HOOKED.append(cls)


def _repack_guard(llama_cpp: ModuleType, path: object) -> AbstractContextManager[object]:
    """The plugin engine's protection where llama.cpp is known to die: a quantized model on an
    AMX CPU is loaded with weight repacking off (``resolve_repack``)."""
    if hasattr(llama_cpp.llama_cpp.llama_model_default_params, MODEL_PARAMS_MARK):
        return contextlib.nullcontext()  # the plugin's engine is loading it, with its own repack setting
    try:
        file_type = gguf_file_type(Path(str(path))) if path else None
    except (OSError, ValueError):
        file_type = None
    use_repack, _note = resolve_repack(None, file_type)
    if use_repack:
        return contextlib.nullcontext()
    return with_default_params(llama_cpp, "llama_model_default_params", use_extra_bufts=False)


@dataclass
class _Log:
    """What one generation (one ``generate`` call) of one Llama did during one run (filled by
    the wrappers, in the timed region). A run's first log also takes what comes before any
    ``generate`` (an ``eval`` the code calls itself)."""

    prompt_tokens: int | None = None  # as ``generate`` was given them
    evaluated: int | None = None  # the first ``eval``'s tokens: the prompt's evaluated part
    prefill_done_ns: int | None = None
    after_prompt: LlamaReading | None = None
    made: list[tuple[int, int]] = field(default_factory=list)  # (clock, token id) per sample
    sample_ns: int = 0
    processors_ns: int = 0
    stopping_ns: int = 0
    grammar: bool = False
    prompt_ids: Sequence[int] = ()
    #: llama.cpp's counters when its ``generate`` was called (a run's later generations).
    began: LlamaReading | None = None
    #: The other watched Llamas' counters when this prompt's logits were ready (an embedding
    #: model's evaluations before the first token are llama.cpp's time, not the code's).
    others_at_prompt: list[tuple[_Probe, LlamaReading | None]] = field(default_factory=list)
    #: A decode step evaluated several tokens (speculative decoding: a draft model's guesses).
    drafted: bool = False


class _Probe:
    """One Llama during one run: cleared (cold), counters read, methods wrapped."""

    def __init__(self, llm: Llama, name: str, lib: ModuleType) -> None:
        self.llm, self.name, self.lib = llm, name, lib
        self.counters = LlamaCounters(llm)
        self.logs = [_Log()]  # one per generation, the current one last
        self.tokenized: list[tuple[int, int]] = []  # (clock at its end, ns) per tokenize call
        self.saved_cache: BaseLlamaCache | None = None
        self.before: LlamaReading | None = None
        self.prompt_ids: list[int] = []  # as the code gave them to ``generate``, after the run
        self.siblings: Sequence[_Probe] = ()  # the run's other watched Llamas

    def arm(self, cold: bool) -> None:
        llm, lib = self.llm, self.lib
        if cold:
            llm.reset()
            lib.llama_memory_clear(lib.llama_get_memory(llm._ctx.ctx), True)
            self.saved_cache, llm.cache = getattr(llm, "cache", None), None
        self.before = self.counters.read()
        for name, wrapper in self._wrappers().items():
            setattr(llm, name, wrapper)

    def disarm(self, cold: bool) -> LlamaRun | None:
        llm = self.llm
        after = self.counters.read()
        for name in WRAPPED:
            llm.__dict__.pop(name, None)
        if cold and self.saved_cache is not None:
            llm.cache = self.saved_cache
        logs = self.logs
        driven = [i for i, g in enumerate(logs) if g.made or g.evaluated is not None]
        if not driven:
            return None  # this Llama was not driven in the run
        # The generation that made the most tokens (the last of equals) is the run's: the others'
        # work lies inside its clock readings (before its first token: in its TTFT).
        at = max(driven, key=lambda i: (len(logs[i].made), i))
        log = logs[at]
        end = logs[at + 1].began if at + 1 < len(logs) else after
        first_eval = log.prefill_done_ns
        self.prompt_ids = [int(t) for t in log.prompt_ids]
        return LlamaRun(
            name=self.name,
            prompt_tokens=log.prompt_tokens,
            evaluated_prompt_tokens=log.evaluated,
            prefill_done_ns=first_eval,
            made_ns=self._generated(log.made),
            native=self._native(self.before, log, end),
            python_sampling_ns=log.processors_ns + log.stopping_ns,
            tokenize_ns=sum(ns for done, ns in self.tokenized if first_eval is None or done <= first_eval),
            generations=sum(1 for g in logs if g.made),
        )

    def _generated(self, made: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """The tokens sampled, less end-of-generation ones (read after the run)."""
        vocab, is_eog = self.llm._model.vocab, self.lib.llama_vocab_is_eog
        return tuple(ns for ns, token in made if not is_eog(vocab, token))

    def _native(self, before: LlamaReading | None, log: _Log, after: LlamaReading | None) -> NativeCounters | None:
        """llama.cpp's counters over the prompt's evaluation (before -> its logits: with the
        run's earlier generations and the other watched Llamas' evaluations before it, an
        embedding model's, all of llama.cpp's evaluations before this one's first token)
        and over the decode steps after it, up to ``after`` (the next generation's start, or the
        run's end); a one-token prompt evaluation (a cached prompt's replayed token) counts as
        the prompt's, as it is, though llama.cpp books it as decode."""
        if before is None or after is None:
            return None
        prompt = log.after_prompt or before
        others = [(o.before, r) for o, r in log.others_at_prompt if o.before is not None and r is not None]
        others_ms = sum(_ms(r) - _ms(b) for b, r in others)
        others_evals = sum(_evals(r) - _evals(b) for b, r in others)
        decode_tokens = _evals(after) - _evals(prompt)
        if log.drafted and len(log.made) >= 2:  # llama.cpp's time per generated token, not per guess
            decode_tokens = len(self._generated(log.made)) - 1
        chain_ms, chain_count = sampler_time(before, after)  # llama.cpp's own time of the run's chain
        if chain_ms is not None and chain_count:
            sample_ms: float | None = chain_ms - log.processors_ns / 1e6
        else:  # the chain kept no time: the clock around llama-cpp-python's sample call
            sample_ms = (log.sample_ns - log.processors_ns) / 1e6 if log.made else None
        return NativeCounters(
            prefill_ms=_ms(prompt) - _ms(before) + others_ms,
            prefill_tokens=_evals(prompt) - _evals(before) + others_evals,
            decode_ms=_ms(after) - _ms(prompt),
            decode_tokens=max(decode_tokens, 0),
            sample_ms=max(sample_ms, 0.0) if sample_ms is not None else None,
            sample_count=chain_count or len(log.made),
            sampled_in_run=True,
            source=f"llama_perf_context ({self.name})",
            sampler="grammar" if log.grammar else "",  # the chain beyond the usual, as a why line names it
        )

    def _wrappers(self) -> dict[str, Callable[..., object]]:
        llm, logs, clock = self.llm, self.logs, time.perf_counter_ns
        cls = type(llm)
        generate, evaluate = cls.generate.__get__(llm), cls.eval.__get__(llm)
        sample, tokenize = cls.sample.__get__(llm), cls.tokenize.__get__(llm)
        init_sampler = cls._init_sampler.__get__(llm)
        read, sync, ctx = self.counters.read, self.lib.llama_synchronize, llm._ctx.ctx
        tokenized, siblings = self.tokenized.append, self.siblings

        def wrapped_generate(tokens: Sequence[int], *args: object, **kwargs: object) -> object:
            if logs[-1].prompt_tokens is not None or logs[-1].made:  # the run's next generation
                logs.append(_Log(began=read()))
            log = logs[-1]
            log.prompt_tokens = len(tokens)
            log.prompt_ids = tokens  # the caller's sequence: copied after the run
            _time_hooks(kwargs, log)
            return generate(tokens, *args, **kwargs)

        def wrapped_eval(tokens: Sequence[int]) -> None:
            evaluate(tokens)
            log = logs[-1]
            if log.evaluated is None:
                # llama.cpp books an evaluation's time at the next synchronize (the sampler's, a
                # moment later): here, so the prompt's logits are ready and its counters read.
                sync(ctx)
                log.prefill_done_ns = clock()
                log.evaluated = len(tokens)
                log.after_prompt = read()
                log.others_at_prompt = [(other, other.counters.read()) for other in siblings]
            elif len(tokens) > 1:  # several tokens in one decode step: a draft model's guesses
                log.drafted = True

        def wrapped_sample(*args: object, **kwargs: object) -> int:
            began = clock()
            token: int = sample(*args, **kwargs)
            made = clock()
            log = logs[-1]
            log.sample_ns += made - began
            log.made.append((made, token))
            return token

        def wrapped_init_sampler(*args: object, **kwargs: object) -> object:
            # llama-cpp-python makes its chain with llama.cpp's default params (no_perf): with no_perf
            # off, llama_perf_sampler times the chain per token inside llama.cpp.
            with with_default_params(self.lib, "llama_sampler_chain_default_params", no_perf=False):
                return init_sampler(*args, **kwargs)

        def wrapped_tokenize(*args: object, **kwargs: object) -> list[int]:
            began = clock()
            ids: list[int] = tokenize(*args, **kwargs)
            done = clock()
            tokenized((done, done - began))
            return ids

        return {
            "generate": wrapped_generate,
            "eval": wrapped_eval,
            "sample": wrapped_sample,
            "tokenize": wrapped_tokenize,
            "_init_sampler": wrapped_init_sampler,
        }


def _evals(r: LlamaReading) -> int:
    return r.prefill_tokens + r.decode_tokens


def _ms(r: LlamaReading) -> float:
    return r.prefill_ms + r.decode_ms


def _time_hooks(kwargs: dict[str, object], log: _Log) -> None:
    """The user's logits processors and stopping criteria, each call timed (their time is
    Python's, though the processors run inside llama.cpp's sampler call)."""
    log.grammar = log.grammar or kwargs.get("grammar") is not None
    for keyword, field_name in (("logits_processor", "processors_ns"), ("stopping_criteria", "stopping_ns")):
        calls = kwargs.get(keyword)
        if calls and isinstance(calls, list):  # llama-cpp-python's LogitsProcessorList, StoppingCriteriaList
            kwargs[keyword] = type(calls)([_timed_call(call, log, field_name) for call in calls])


def _timed_call(
    fn: Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], object], log: _Log, field_name: str
) -> Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], object]:
    """``fn(ids, values)`` with its time added to ``log``'s ``field_name`` (ns)."""
    clock = time.perf_counter_ns

    def run(ids: npt.NDArray[np.intc], values: npt.NDArray[np.single]) -> object:
        began = clock()
        out = fn(ids, values)
        setattr(log, field_name, getattr(log, field_name) + clock() - began)
        return out

    return run


def watch_llamas() -> LlamaWatch | None:
    """A ``LlamaWatch`` over this process's Llamas (None: llama-cpp-python is not importable
    here, so no Llama can exist)."""
    try:
        return LlamaWatch()
    except EngineError:
        return None


class LlamaWatch(RunWatch):
    """The Llamas a callable drives, around each of its runs (``arm`` / ``disarm``): ``RunWatch``."""

    def __init__(self) -> None:
        self._lib = import_llama_cpp()
        self._names: dict[int, str] = {}
        self.driven: dict[str, Llama] = {}  # name -> Llama, the ones that worked in some run
        self.runs_with_new = 0  # runs during which a new Llama was made
        self._prompts: dict[str, list[int]] = {}  # name -> its last run's prompt ids
        self._made_before = 0

    def know(self, llm: Llama, info: EngineInfo) -> None:
        """``llm`` was made by an engine of the plugin (the fixtures' ``llmperf_llm``): its memory
        figures are that engine's (llama.cpp's log of its load)."""
        _SEEN.add(llm)
        _BUFFERS[llm] = {
            kind: value for kind, name in BUFFER_FIELDS.items() if (value := getattr(info, name)) is not None
        }

    def name(self, llm: Llama) -> str:
        """A Llama's name in reports: its model file's stem, numbered when several share it."""
        key = id(llm)
        if key not in self._names:
            stem = Path(str(getattr(llm, "model_path", "llama"))).stem
            taken = sum(1 for n in self._names.values() if n.split("#")[0] == stem)
            self._names[key] = f"{stem}#{taken + 1}" if taken else stem
        return self._names[key]

    def arm(self, cold: bool) -> list[_Probe]:
        _hook()
        for llm in list(_SEEN):
            if not _is_open(llm) and "tokenize" not in vars(llm):  # closed, not guarded yet
                _guard_closed(llm, self.name(llm))
        probes = [_Probe(llm, self.name(llm), self._lib) for llm in live_llamas()]
        for probe in probes:
            probe.siblings = [other for other in probes if other is not probe]
        self._made_before = _MADE[0]
        for probe in probes:
            probe.arm(cold)
        return probes

    def disarm(self, probes: Sequence[_Probe], cold: bool) -> list[LlamaRun]:
        runs = []
        for probe in probes:
            run = probe.disarm(cold)
            if run is not None:
                runs.append(run)
                self.driven.pop(run.name, None)
                self.driven[run.name] = probe.llm  # the most recent last
                self._prompts[run.name] = probe.prompt_ids
        self._check_new(probes)
        return runs

    def _check_new(self, probes: Sequence[_Probe]) -> None:
        """A Llama made during a run (a lazy first load is fine once; every run is a bug in the
        test: the model load lies inside each timed run)."""
        if _MADE[0] != self._made_before:
            self.runs_with_new += 1
        if self.runs_with_new >= MAX_RUNS_WITH_NEW:
            raise EngineError(
                f"the callable made a new llama_cpp.Llama in {self.runs_with_new} runs: each run then times a model "
                "load, and its tokens cannot be measured as llama.cpp's; build it once, outside the callable "
                "(a fixture or the module), and let the callable use it"
            )

    def info(self, base: EngineInfo) -> EngineInfo:
        """``base`` (the callable's) with the facts and settings of the Llama it drove most
        recently (``llamas``: all of them by name)."""
        if not self.driven:
            return base
        named = dataclasses.replace(base, llamas=tuple(self.driven))
        llm = list(self.driven.values())[-1]
        return llama_facts(self._lib, llm, named) if _is_open(llm) else named

    def driven_llama(self) -> DrivenLlamaEngine | None:
        """The Llama driven most recently, as an in-process llama.cpp engine (``DrivenLlama``)."""
        if not self.driven:
            return None
        name, llm = list(self.driven.items())[-1]
        if not _is_open(llm):
            return None
        return DrivenLlamaEngine(
            llm, self.info(EngineInfo(engine="llama.cpp", model=name)), self._prompts.get(name, [])
        )


#: What a closed Llama's code calls first: each raises one line instead (llama-cpp-python does not
#: check, and llama.cpp then reads freed memory: the process dies).
CLOSED_GUARDED = ("tokenize", "detokenize", "generate", "eval", "sample")


def _guard_closed(llm: Llama, name: str) -> None:
    """A closed Llama (``close()``, a ``with`` block ended) answers a call with one line."""

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise EngineError(
            f"the callable drove llama_cpp.Llama {name!r} after it was closed (Llama.close() or the end of its "
            "with-block); keep it open while it is measured"
        )

    for method in CLOSED_GUARDED:
        setattr(llm, method, refuse)


class DrivenLlamaEngine(Engine, LayerTiming):
    """A user's ``llama_cpp.Llama`` as the plugin's timed loop drives it, for the attribution pass
    and per-layer timing of a measured callable: the Llama's own model and context settings, the
    prompt as the user's code built it (its last run's), greedy decoding with end of generation
    banned (runs of equal length). Its plain runs use the Llama's own context, cleared before and
    after each (llama-cpp-python's bookkeeping reset too), so the user's next run starts cold."""

    def __init__(self, llm: Llama, info: EngineInfo, prompt_ids: Sequence[int]) -> None:
        self.llm, self._info, self._prompt = llm, info, list(prompt_ids)
        self._lib = import_llama_cpp()
        vocab = llm._model.vocab
        n_vocab = int(self._lib.llama_vocab_n_tokens(vocab))
        self._eog = [t for t in range(n_vocab) if self._lib.llama_vocab_is_eog(vocab, t)]
        self._n_vocab = n_vocab
        self.n_batch = int(self._lib.llama_n_batch(llm._ctx.ctx))

    @property
    def lib(self) -> ModuleType:
        return self._lib

    def info(self) -> EngineInfo:
        return self._info

    def make_sampler(self) -> llama_sampler_p:
        return greedy_sampler(self._lib, self._n_vocab, self._eog)

    def prompt_ids(self, workload: Workload) -> list[int]:
        """The prompt as the user's code built it (its last run's); else the workload's as the
        callable was given it: a chat request's messages rendered through the model's chat
        template as ``create_chat_completion`` renders them, a prompt's text tokenized."""
        if self._prompt:
            return list(self._prompt)
        workload = workload.request(0)  # a prompt set: its first run's request
        if workload.messages is not None:
            render = chat_formatter(self.llm, self._info.model)
            messages = cast("list[ChatCompletionRequestMessage]", chat_dicts(workload.messages))
            return chat_prompt_ids(self.llm, render, messages)
        text = (
            workload.prompt if workload.prompt is not None else synthetic_text(workload.synthetic_prompt_tokens or 0, 0)
        )
        return list(self.llm.tokenize(text.encode("utf-8")))

    def decode_feed(self, workload: Workload) -> list[int] | None:
        return None  # sampled, greedy, in the loop

    def instrumented_context(self, cb_eval: object, tokens: int) -> llama_context_p:
        params = type(self.llm.context_params).from_buffer_copy(self.llm.context_params)
        params.n_ctx = max(int(params.n_ctx), -(-tokens // AUTO_CTX_STEP) * AUTO_CTX_STEP)
        params.cb_eval = cb_eval
        params.cb_eval_user_data = None
        ctx = self._lib.llama_init_from_model(self.llm._model.model, params)
        if not ctx:
            raise EngineError("llama.cpp could not create the instrumented context of your Llama")
        return ctx

    def timed_decode(
        self, ctx: Context, prompt_ids: Sequence[int], max_tokens: int, *, feed: Sequence[int] | None, sampler: Sampler
    ) -> TimedDecode:
        return timed_decode(self._lib, ctx, prompt_ids, max_tokens, self.n_batch, feed=feed, sampler=sampler)

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        lib, llm = self._lib, self.llm
        ctx = llm._ctx.ctx
        workload = workload.request(run_index)  # a prompt set's request of this run
        prompt = self.prompt_ids(workload)
        sampler = self.make_sampler()
        try:
            self._clear()
            lib.llama_perf_context_reset(ctx)
            timed = timed_decode(lib, ctx, prompt, workload.max_tokens, self.n_batch, feed=None, sampler=sampler)
            perf = lib.llama_perf_context(ctx)
        finally:
            lib.llama_sampler_free(sampler)
            self._clear()
        return RunTrace(
            start_ns=timed.start_ns,
            prefill_done_ns=timed.prefill_done_ns,
            token_ns=timed.token_ns,
            prompt_tokens=len(prompt),
            native=NativeCounters(
                prefill_ms=float(perf.t_p_eval_ms),
                prefill_tokens=int(perf.n_p_eval),
                decode_ms=float(perf.t_eval_ms),
                decode_tokens=int(perf.n_eval),
            ),
        )

    def _clear(self) -> None:
        self.llm.reset()
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self.llm._ctx.ctx), True)


def llama_facts(lib: ModuleType, llm: Llama, base: EngineInfo) -> EngineInfo:
    """``base`` with a user's Llama's ``EngineInfo`` fields: its model, its llama.cpp settings (the
    fingerprint's), its memory (the KV cache from its size, the model file's mapping)."""
    ctx, cparams, mparams = llm._ctx.ctx, llm.context_params, llm.model_params
    n_ctx, facts = int(lib.llama_n_ctx(ctx)), with_model_facts(lib, llm, base)
    per_position = facts.kv_bytes_per_position()
    kv_mib = None if per_position is None else per_position * n_ctx / 2**20
    path = str(getattr(llm, "model_path", "") or "")
    mapped = mapped_file_mib(path) if path else None
    logged = _BUFFERS.get(llm, {})
    return dataclasses.replace(
        facts,
        model_path=path or None,
        threads=int(cparams.n_threads),
        n_ctx=n_ctx,
        n_batch=int(lib.llama_n_batch(ctx)),
        n_ubatch=int(cparams.n_ubatch),
        flash_attn=_flash_attn(cparams),
        type_k=_type_name(cparams.type_k),
        type_v=_type_name(cparams.type_v),
        **_load_mode(lib, mparams),
        offload_kqv=bool(cparams.offload_kqv),
        gpu_layers=0 if not lib.llama_supports_gpu_offload() else int(mparams.n_gpu_layers),
        repack=bool(getattr(mparams, "use_extra_bufts", True)),
        backend_version=llama_cpp_version(),
        compute_mib=logged.get("compute"),
        output_mib=logged.get("output"),
        model_buffer_mib=logged.get("model"),
        kv_mib=logged.get("kv", kv_mib),
        mapped_mib=mapped[0] if mapped else None,
        mapped_resident_mib=mapped[1] if mapped else None,
    )


class _LoadMode(TypedDict):
    mmap: bool | None
    mlock: bool | None


def _load_mode(lib: ModuleType, mparams: llama_model_params) -> _LoadMode:
    """mmap and mlock as the model was loaded (``load_mode``; older bindings: ``use_mmap``/``use_mlock``)."""
    mode = getattr(mparams, "load_mode", None)
    if mode is None:
        return {"mmap": getattr(mparams, "use_mmap", None), "mlock": getattr(mparams, "use_mlock", None)}
    names = {getattr(lib, n, None): n for n in dir(lib) if n.startswith("LLAMA_LOAD_MODE_")}
    name = names.get(int(mode), "")
    return {"mmap": "MMAP" in name, "mlock": "MLOCK" in name}


def _flash_attn(cparams: llama_context_params) -> bool | None:
    """llama.cpp's flash attention as asked: on (1) or off; auto (-1) as llama.cpp decides is None."""
    value = getattr(cparams, "flash_attn_type", getattr(cparams, "flash_attn", None))
    if value is None or int(value) < 0:
        return None
    return bool(value)


def _type_name(value: int) -> str | None:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(int(value)).name.lower()
    except (ImportError, ValueError):
        return None
