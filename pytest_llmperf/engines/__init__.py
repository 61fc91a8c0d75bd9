"""Engines turn a workload into run traces. They know nothing of pytest.

What an engine is and what it may offer: ``capabilities`` (the ``Engine`` protocol and one
protocol per further ability), imported from there.

Measure any token stream: a callable ``fn(prompt, max_tokens)`` returning an iterable.

This is how users plug in an engine we do not ship: each item the iterable yields counts as
one generated token, stamped when the item arrives. A callable that drives a model whose
llama.cpp counters can be read (the fixtures' ``llama_cpp.Llama``: ``engines.llama_cpp.LlamaCounters``)
is given them as its ``counters``: read around each run, they split its time into llama.cpp's
and the rest (the parts of each phase) as for the plugin's own engine."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeGuard, TypeVar

from ..core.errors import EngineError, NotSteppable
from ..core.workload import ChatMessage, EngineInfo, LlamaRun, NativeCounters, RunTrace, Workload, chat_dicts
from .capabilities import DrivenLlama, Engine, LayerTiming, SteppedRuns

#: What a measured callable is given first: the prompt's text, or a chat request's messages.
Request = str | list[dict[str, str]]
#: A measured callable (an ``async def`` one that yields is driven on an event loop of its own).
TokenStream = Callable[[Request, int], Iterable[object]]


def is_token_stream(value: object) -> TypeGuard[TokenStream]:
    """A callable measured as ``fn(prompt, max_tokens)`` (what it yields is read when it runs)."""
    return callable(value)


Reading = TypeVar("Reading")


class CounterSource(Protocol[Reading]):
    """llama.cpp's own counters of a model that a callable drives, read around each of its runs:
    ``read()`` just before the run's first clock read and just after its last one (never between
    them), ``between(before, after)`` the run's ``NativeCounters`` (None: the counters did not
    move, the callable did not drive that model)."""

    def read(self) -> Reading: ...

    def between(self, before: Reading, after: Reading) -> NativeCounters | None: ...

    def memory(self) -> Mapping[str, float | None]:
        """The model's memory figures (``core.workload.MEMORY_FIELDS``: llama.cpp's buffers,
        the file mapping) as its engine reports them; empty when unknown."""
        ...


class RunWatch(Protocol):
    """The ``llama_cpp.Llama`` objects a callable drives, around each of its runs
    (``engines.user_llama.LlamaWatch``): ``arm`` before the run's first clock read (cleared when
    ``cold``, instrumented), ``disarm`` after its last (each driven Llama's ``LlamaRun``)."""

    driven: Mapping[str, object]

    def arm(self, cold: bool) -> Sequence[Any]: ...

    def disarm(self, probes: Sequence[Any], cold: bool) -> list[LlamaRun]: ...

    def info(self, base: EngineInfo) -> EngineInfo: ...

    def driven_llama(self) -> LayerTiming | None: ...


def synthetic_text(n_words: int, seed: int) -> str:
    """A seeded prompt of ``n_words`` short words (about one token each for most tokenizers)."""
    import numpy as np  # not at import: the engines package is read at every pytest start

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return " ".join("".join(rng.choice(letters, size=3)) for _ in range(n_words))


class CallableEngine(Engine, DrivenLlama):
    """Wraps ``fn(prompt, max_tokens) -> iterable of tokens`` as an engine (``info`` and
    ``run``, none of the abilities of ``engines.capabilities``).

    ``watch`` (``engines.user_llama.LlamaWatch``): every ``llama_cpp.Llama`` of the process,
    cleared before each run (``workload.prompt_cache`` "cold") and instrumented for it, so a run
    on a Llama the plugin sees is measured as the plugin's engine is: its tokens where llama.cpp
    made them (the stream's items kept as ``delivered_ns``), its prompt's tokens evaluated and
    reused, llama.cpp's counters over exactly the prompt and the decode steps, sampling apart.
    ``counters`` (without a watch): the llama.cpp counters of the model ``fn`` may drive, read
    around each run into its trace's ``native`` (None: a run's time is not split)."""

    def __init__(
        self,
        fn: TokenStream,
        name: str | None = None,
        *,
        counters: CounterSource[Any] | None = None,
        watch: RunWatch | None = None,
    ) -> None:
        if not callable(fn):
            raise EngineError(f"engine must be callable as fn(prompt, max_tokens), got {fn!r}")
        if _returns_once(fn):
            raise EngineError(
                f"{getattr(fn, '__name__', fn)!r} is an async function that returns once: yield each token "
                "(async def fn(prompt, max_tokens): ... yield text), so its tokens can be timed"
            )
        self._fn = fn
        #: An async generator function: each run drives it on an event loop of its own.
        self._async = _is_async_stream(fn)
        self.counters = counters
        self.watch = watch
        self._info = EngineInfo(engine="callable", model=name or str(getattr(fn, "__name__", "callable")))
        self._talk: tuple[int, list[str]] = (0, [])  # a conversation's run: its replies so far

    def info(self) -> EngineInfo:
        """The callable's name; with a watch, the facts, settings and memory of the Llamas it
        drove; with ``counters``, the memory figures of the model it drives."""
        if self.watch is not None and self.watch.driven:
            return self.watch.info(self._info)
        if self.counters is None:
            return self._info
        memory: dict[str, Any] = dict(self.counters.memory())  # MEMORY_FIELDS: MiB figures
        return dataclasses.replace(self._info, **memory)

    def driven_llama(self) -> LayerTiming | None:
        """The Llama the callable drove most recently, as an in-process llama.cpp engine
        (``DrivenLlama``; None: no watch, or no run drove a Llama)."""
        return self.watch.driven_llama() if self.watch is not None else None

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        workload = workload.request(run_index)  # a prompt set's request of this run
        if workload.turn is not None:
            prompt: Request = chat_dicts(turn_chat(self._talk, workload, run_index))
        else:
            prompt = self._prompt(workload)
        counters, watch = self.counters, self.watch
        # A conversation's later turns keep what the run's earlier turns left (its prompt cache).
        cold = workload.prompt_cache == "cold" and (workload.turn or 1) == 1
        probes = watch.arm(cold) if watch is not None else ()  # before the first clock read
        before = counters.read() if counters is not None and watch is None else None
        clock = time.perf_counter_ns
        stamps: list[int] = []
        append = stamps.append
        items: list[object] = []  # a conversation's reply, fed back to its next turn
        keep = items.append if workload.turn is not None else None
        start = clock()
        try:
            if self._async:
                start = self._drive(prompt, workload.max_tokens, stamps, keep)
            elif keep is None:
                for _ in self._fn(prompt, workload.max_tokens):
                    append(clock())
            else:
                for item in self._fn(prompt, workload.max_tokens):
                    append(clock())
                    keep(item)
        except ValueError as exc:  # llama-cpp-python's "Requested tokens (N) exceed context window of M"
            if "context window" in str(exc):
                where = f"conversation turn {workload.turn}: " if keep is not None else ""
                raise EngineError(f"{where}{exc}; {CONTEXT_TODO}") from None
            raise
        finally:
            llamas = watch.disarm(probes, cold) if watch is not None else []  # after the last
        if workload.turn is not None:
            self._replied(workload.turn, run_index, "".join(item_text(i) for i in items))
        if watch is not None:
            return self._watched(start, stamps, llamas)
        native = counters.between(before, counters.read()) if counters is not None else None
        return self._trace(start, stamps, native)

    def _drive(self, prompt: Request, max_tokens: int, stamps: list[int], keep: Callable[[object], None] | None) -> int:
        """An async generator's run on an event loop of its own (in a thread of its own where
        this thread runs one already): its clock readings, the first (returned) the moment the
        loop runs it, are taken in that loop."""
        import asyncio  # an HTTP engine's stack: lazy (a plain pytest run needs none of it)

        clock = time.perf_counter_ns

        async def drain() -> int:
            start = clock()
            stream: object = self._fn(prompt, max_tokens)
            assert isinstance(stream, AsyncIterable)  # _is_async_stream
            async for item in stream:
                stamps.append(clock())
                if keep is not None:
                    keep(item)
            return start

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(drain())
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llmperf-async-run") as apart:
            return apart.submit(asyncio.run, drain()).result()

    def _trace(self, start: int, stamps: list[int], native: NativeCounters | None) -> RunTrace:
        if len(stamps) < 2:
            raise EngineError(f"engine {self._info.model!r} yielded {len(stamps)} token(s); at least 2 are needed")
        return RunTrace(start_ns=start, prefill_done_ns=None, token_ns=tuple(stamps), prompt_tokens=None, native=native)

    def _watched(self, start: int, stamps: list[int], llamas: list[LlamaRun]) -> RunTrace:
        """A run's trace from the Llama that made its tokens (the one that made the most: the
        others' work is inside its clock readings), or from the stream's items when none did."""
        made = [run for run in llamas if len(run.made_ns) >= 2]
        if not made and any(run.made_ns for run in llamas):
            raise EngineError(
                f"{self._info.model!r} drove llama_cpp.Llama {', '.join(r.name for r in llamas)} but it made "
                f"{max(len(r.made_ns) for r in llamas)} token per run: decode needs at least 2; pass max_tokens "
                "on to the Llama and let no stop sequence end the run early"
            )
        if not made:
            trace = self._trace(start, stamps, None)
            return trace if not llamas else dataclasses.replace(trace, native=llamas[0].native)
        main = max(made, key=lambda run: len(run.made_ns))
        return RunTrace(
            start_ns=start,
            prefill_done_ns=main.prefill_done_ns,
            token_ns=main.made_ns,
            prompt_tokens=main.prompt_tokens,
            native=main.native,
            delivered_ns=tuple(stamps),
            prompt_reused_tokens=main.reused_prompt_tokens,
            tokenize_in_run_ns=main.tokenize_ns,
            python_sampling_ns=main.python_sampling_ns,
            generations=sum(run.generations for run in llamas),
        )

    def _replied(self, turn: int, run_index: int, reply: str) -> None:
        self._talk = (run_index, [*self._talk[1], reply] if turn > 1 else [reply])

    def _prompt(self, workload: Workload) -> Request:
        """What ``fn`` is given as its prompt: the text, or a chat request's messages
        (``[{"role": ..., "content": ...}, ...]``, for ``Llama.create_chat_completion``)."""
        if workload.conversation is not None:
            raise EngineError(NOT_ONE_REQUEST)
        if workload.messages is not None:
            return chat_dicts(workload.messages)
        if workload.prompt is not None:
            return workload.prompt
        return synthetic_text(workload.synthetic_prompt_tokens or 0, workload.seed)


#: What to do about a conversation beyond the context of the Llama a callable drives.
CONTEXT_TODO = "give that Llama a larger n_ctx (llmperf_llm: --llmperf-n-ctx) or shorten the prompt or conversation"

#: What an engine says when asked for a conversation's prompt outside its turns (``whole_run``).
NOT_ONE_REQUEST = "a conversation is sent turn by turn (Workload.at_turn), not as one request"


def turn_chat(talk: tuple[int, list[str]], workload: Workload, run_index: int) -> tuple[ChatMessage, ...]:
    """A conversation turn's chat: the system message, the user turns so far and the replies to
    the run's earlier turns, kept by an engine that sends each turn its whole chat (``talk``:
    the run index and its replies so far)."""
    assert workload.conversation is not None and workload.turn is not None
    k = workload.turn
    if k > 1 and (talk[0], len(talk[1])) != (run_index, k - 1):
        raise EngineError(f"conversation turn {k} of run {run_index} asked without its turn {k - 1} just before")
    return workload.conversation.messages(talk[1] if k > 1 else [])


def item_text(item: object) -> str:
    """The text one item of a callable's stream carries: a string, or a completion chunk's
    (``choices[0]``'s ``delta.content`` or ``text``, as llama-cpp-python and OpenAI stream them)."""
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        choices = item.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            choice = choices[0]
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, Mapping) else choice.get("text")
            return text if isinstance(text, str) else ""
    return ""


class SteppedCallableEngine(CallableEngine, SteppedRuns):
    """A callable that drives a model whose counters it was given (the fixtures' Llama), run
    token by token (``SteppedRuns``): the iterable is asked for each next token only after
    ``pause()`` returned. Whether the callable computed while paused is not assumed, it is
    checked: the counters are read around every pause (outside the clock reads), and a run
    whose counters moved during one (tokens made ahead of the reader, in a thread or a server)
    or never moved at all raises ``NotSteppable``."""

    counters: CounterSource[Any]

    def __init__(
        self, fn: TokenStream, name: str | None = None, *, counters: CounterSource[Any], watch: RunWatch | None = None
    ) -> None:
        super().__init__(fn, name, counters=counters, watch=watch)

    def run_stepped(self, workload: Workload, run_index: int, pause: Callable[[], None]) -> RunTrace:
        if self._async:
            raise NotSteppable(
                f"{self._info.model!r} is an async generator: its event loop cannot pause between tokens"
            )
        workload = workload.request(run_index)
        prompt = self._prompt(workload)
        counters, watch = self.counters, self.watch
        cold = workload.prompt_cache == "cold"
        probes = watch.arm(cold) if watch is not None else ()
        before = counters.read()  # before the first clock read
        self._hold(pause)
        clock = time.perf_counter_ns
        stamps: list[int] = []
        pauses: list[tuple[int, int]] = []
        paused_ns = 0
        start = clock()
        try:
            for _ in self._fn(prompt, workload.max_tokens):
                arrived = clock()
                stamps.append(arrived - paused_ns)
                self._hold(pause)
                resumed = clock()
                pauses.append((arrived, resumed))
                paused_ns += resumed - arrived
        finally:
            llamas = watch.disarm(probes, cold) if watch is not None else []
        native = counters.between(before, counters.read())  # after the last
        if native is None:
            raise NotSteppable(f"{self._info.model!r} did not call the fixtures' Llama: its pauses cannot be checked")
        if watch is not None:
            llamas = [dataclasses.replace(run, made_ns=_without_pauses(run.made_ns, pauses)) for run in llamas]
            return self._watched(start, stamps, llamas)
        return self._trace(start, stamps, native)

    def _hold(self, pause: Callable[[], None]) -> None:
        """One pause, the counters read around it: llama.cpp must not have worked meanwhile."""
        before = self.counters.read()
        pause()
        if self.counters.between(before, self.counters.read()) is not None:
            raise NotSteppable(
                f"{self._info.model!r} ran llama.cpp while paused between tokens (its tokens are made ahead "
                "of the reader: a thread or a server)"
            )


def _is_async_stream(fn: object) -> bool:
    """``fn`` (or its ``__call__``) is an async generator function."""
    return _defined_as(fn, inspect.isasyncgenfunction)


def _returns_once(fn: object) -> bool:
    """``fn`` (or its ``__call__``) is an ``async def`` without ``yield``: a coroutine, no stream."""
    return _defined_as(fn, inspect.iscoroutinefunction)


def _defined_as(fn: object, kind: Callable[[object], bool]) -> bool:
    return kind(fn) or kind(type(fn).__dict__.get("__call__"))


def _without_pauses(made_ns: Sequence[int], pauses: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """Token stamps with the time of every pause that ended before each taken out (a stepped
    run: ``pauses`` as (began, ended) clock readings)."""
    return tuple(stamp - sum(end - began for began, end in pauses if end <= stamp) for stamp in made_ns)
